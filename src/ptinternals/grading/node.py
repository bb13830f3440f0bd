"""What grading on this node will use, for ``ptgrade doctor``: its place in a cluster job (Slurm array task
or Kubernetes Indexed Job pod, see ``scheduler``), the gradebook (reachable? the assignment registered?),
and the submissions its shard holds and still has to grade.

Run first in each task of the job templates, it makes a task that cannot grade stop at once with the
reason in its log (exit status 3), instead of failing midway or racing the other tasks.
"""
from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote

from .classroom import Course, shard
from .nbgrader_plugin import normalize_db_url
from .scheduler import placement


def node_rows(db_url: str | None, assignment: str | None) -> tuple[list[tuple[str, str]], bool]:
    """(rows, ok): the scheduler task and shard, the gradebook, and the submissions of ``assignment`` to grade."""
    from .cli import UsageError, _assignments, _check_assignment, find_root

    rows, ok, shard_spec = [], True, None
    try:
        where = placement()
        shard_spec = where.shard
        rows.append(("scheduler", f"{where.scheduler}: {where.task}"))
        rows.append(("shard (--shard auto)", shard_spec or "none: every submission"))
    except ValueError as e:
        rows.append(("shard (--shard auto)", f"UNUSABLE: {e}"))
        ok = False
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        rows.append(("CUDA_VISIBLE_DEVICES", os.environ["CUDA_VISIBLE_DEVICES"] or "(empty: no GPU)"))
    try:
        root = find_root()
    except UsageError as e:
        return rows + [("course root", str(e))], ok
    rows.append(("course root", str(root)))
    db = db_url or os.environ.get("PTGRADE_DB_URL") or f"sqlite:///{root}/autograder/gradebook.db"
    reachable, registered, detail = gradebook_status(db, assignment)
    rows.append(("gradebook", detail))
    ok = ok and reachable
    if not assignment:
        rows.append(("assignments", ", ".join(_assignments(root))))
        return rows, ok
    name = _check_assignment(root, assignment)
    if reachable and not registered:
        # One task registers it fine; several tasks at once race to insert the same rows.
        rows.append((name, f"NOT in the gradebook: run `ptgrade release {name} --db ...` once"
                     + (" before submitting the array" if shard_spec else " (autograde would register it)")))
        ok = ok and not shard_spec
    course = Course(root, db)
    everyone = course.students_with(name)
    mine = shard(everyone, shard_spec)
    todo = [s for s in mine if course.needs_grading(s, name)]
    listed = ", ".join(todo[:20]) + (", ..." if len(todo) > 20 else "")
    rows.append(("submissions", f"{len(everyone)} of {name}; this shard {len(mine)}, to grade {len(todo)}"
                 + (f": {listed}" if todo else "")))
    return rows, ok


def gradebook_status(db_url: str, assignment: str | None) -> tuple[bool, bool, str]:
    """(reachable, assignment registered, one line) for the gradebook at ``db_url``, without creating anything."""
    from sqlalchemy import create_engine, inspect, text
    from sqlalchemy.engine import make_url

    url = make_url(normalize_db_url(db_url))
    shown = unquote(make_url(db_url).render_as_string(hide_password=True))
    if url.get_backend_name() == "sqlite":
        path = Path(url.database or "")
        if not path.exists():
            usable = os.access(path.parent, os.W_OK)
            return usable, False, f"{shown}: {'not created yet' if usable else 'UNREACHABLE: its folder is not writable'}"
    connect_args = {"connect_timeout": 10} if url.get_backend_name() == "postgresql" else {}
    engine = create_engine(url, connect_args=connect_args)
    try:
        with engine.connect() as conn:
            if "notebook" not in inspect(conn).get_table_names():
                return True, False, f"{shown}: reachable, empty"
            names = [r[0] for r in conn.execute(text("SELECT name FROM assignment ORDER BY name"))]
            registered = bool(assignment) and bool(conn.execute(text(
                "SELECT count(*) FROM notebook n JOIN assignment a ON n.assignment_id = a.id WHERE a.name = :name"),
                {"name": assignment}).scalar())
    except Exception as e:  # the driver's own message says why (no such host, refused, authentication)
        first = str(getattr(e, "orig", e)).strip().splitlines()
        return False, False, f"{shown}: UNREACHABLE: {first[0] if first else type(e).__name__}"
    finally:
        engine.dispose()
    return True, registered, f"{shown}: reachable, assignments: {', '.join(names) or 'none'}"
