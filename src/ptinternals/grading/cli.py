"""``ptgrade``: the instructor's command line (and ``ptgrade validate`` for students).

    ptgrade doctor                           what this machine has and what grading will use
    ptgrade release strides             register the assignment, write notebooks/ (nbgrader)
    ptgrade collect strides --from DIR  import submissions (DIR/<student>/...), or --exchange, --zips
    ptgrade autograde strides -j 2      grade in a sandbox, in parallel; reruns grade only what is missing
    ptgrade feedback strides            HTML feedback without hidden tests
    ptgrade export --to grades.csv           the gradebook as CSV
    ptgrade summary strides             pass rates, histogram, slowest, failures by category
    ptgrade student-edition --out DIR   the student edition: notebooks, student package, wheel, no solutions
    ptgrade validate my_notebook.ipynb       (students) is every test cell still there and unchanged?

Exit codes: 0 success; 1 some submissions could not be graded or validation found problems;
2 bad usage (unknown assignment, malformed arguments); 3 the environment cannot grade (see doctor).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

EXIT_OK, EXIT_FAILURES, EXIT_USAGE, EXIT_ENV = 0, 1, 2, 3


class UsageError(Exception):
    pass


def find_root(start: Path | None = None) -> Path:
    env = os.environ.get("PTGRADE_ROOT")
    if env:
        return Path(env).resolve()
    here = (start or Path.cwd()).resolve()
    for p in [here, *here.parents]:
        if (p / "autograder" / "nbgrader_config.py").exists() and (p / "solutions").is_dir():
            return p
    raise UsageError("not inside the course repository (no autograder/nbgrader_config.py above "
                     f"{here}); cd into it or set PTGRADE_ROOT")


def _assignments(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "solutions").iterdir()
                  if p.is_dir() and (p / f"{p.name}.ipynb").exists())


def _check_assignment(root: Path, name: str) -> str:
    from ..course import RENAMED

    known = _assignments(root)
    if name not in known:
        if name in RENAMED:
            raise UsageError(f"assignment {name!r} is now called {RENAMED[name]!r} (chapters are named by slug, "
                             f"not number; see 'Names' in book/instructors.md)")
        raise UsageError(f"unknown assignment {name!r}; known: {', '.join(known) or 'none'}")
    return name


def _nbgrader(root: Path, *args: str, db_url: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if db_url:
        env["PTGRADE_DB_URL"] = db_url
    (root / "autograder").mkdir(exist_ok=True)
    # nbgrader reads nbgrader_config.py from its working folder: autograder/ holds ours.
    cmd = [sys.executable, "-m", "nbgrader", *args]
    return subprocess.run(cmd, cwd=root / "autograder", env=env, text=True, capture_output=True)


# ---- commands --------------------------------------------------------------------------------------
def cmd_doctor(args) -> int:
    import platform

    import numpy
    import torch

    from ..device import describe, pick_device
    from .sandbox import resolve_isolation

    rows = [("python", platform.python_version()), ("torch", torch.__version__), ("numpy", numpy.__version__)]
    try:
        import triton

        rows.append(("triton", triton.__version__))
    except Exception as e:
        rows.append(("triton", f"not importable ({type(e).__name__})"))
    try:
        import nbgrader

        rows.append(("nbgrader", nbgrader.__version__))
    except Exception:
        rows.append(("nbgrader", "NOT INSTALLED: cannot autograde"))
    ok = True
    rows.append(("cuda", f"{torch.version.cuda or 'none'}; available: {torch.cuda.is_available()}"
                 + (f", {torch.cuda.device_count()} device(s)" if torch.cuda.is_available() else "")))
    try:
        device = pick_device(args.device)
        info = describe(device)
        rows.append(("grading device", f"{info.kind} ({info.name}); Triton {info.triton_mode}"))
    except RuntimeError as e:
        device, ok = "cpu", False
        rows.append(("grading device", f"UNAVAILABLE: {e}"))
    try:
        mode, why = resolve_isolation(args.isolation, device)
        rows.append(("isolation", f"{mode} ({why})"))
        rows += enforcement_rows(mode, device)
    except RuntimeError as e:
        rows.append(("isolation", f"UNAVAILABLE: {e}"))
        ok = False
    from .node import node_rows

    cluster_rows, cluster_ok = node_rows(args.db, args.assignment)
    rows += cluster_rows
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:>{width}}  {v}")
    return EXIT_OK if ok and cluster_ok and "NOT INSTALLED" not in dict(rows)["nbgrader"] else EXIT_ENV


def enforcement_rows(mode: str, device: str) -> list[tuple[str, str]]:
    """What this machine enforces on a submission, and where: the statement ``ptgrade doctor`` prints."""
    from .isolation import ABSENTABLE, absent_paths
    from .resources import cgroup_support
    from .sandbox import Limits

    lim, root, bwrap = Limits(), os.geteuid() == 0, mode == "bwrap"
    cg, cg_why = cgroup_support()
    rows = [("grades of record", "allowed (bubblewrap)" if bwrap else
             "REFUSED unless --allow-weak-isolation (process isolation cannot hide files or packages)")]
    hidden = absent_paths(tuple(ABSENTABLE)) if bwrap else ()
    rows.append(("forbidden packages", f"absent from the sandbox's filesystem ({len(hidden)} paths of torch/numpy "
                 f"mounted over when an exercise forbids them)" if bwrap else
                 "NOT absent: an import hook refuses them (a speed bump, not a guarantee)"))
    rows.append(("memory", f"{lim.memory_mb} MiB per sandbox, tmpfs and shared memory included ({cg_why})" if cg else
                 f"{lim.memory_mb} MiB per process (RLIMIT_AS, beyond what import torch maps); tmpfs and shared memory NOT counted ({cg_why})"))
    rows.append(("processes", f"{lim.nproc} per sandbox (cgroup pids.max and RLIMIT_NPROC of a dedicated uid)" if cg
                 else (f"{lim.nproc} (RLIMIT_NPROC of a dedicated uid)" if root else
                       "NOT limited (no dedicated uid): a fork bomb is stopped by the time limit only")))
    rows.append(("disk", (f"scratch: a {lim.disk_mb} MiB tmpfs" if root else
                          f"scratch: {lim.disk_mb} MiB, measured every 0.5 s") +
                 (f"; /tmp and /dev/shm: {lim.tmp_mb} MiB tmpfs each, the sandbox's own" if bwrap else
                  f"; /tmp and /dev/shm are the host's ({lim.fsize_mb} MiB per file)")))
    rows.append(("leftovers", "none: the sandbox's folders are removed, its processes killed by "
                 + ("cgroup and uid" if root else "session") + (", its /tmp vanishes with it" if bwrap else
                 (", files its uid left in /tmp, /var/tmp, /dev/shm deleted" if root else
                  "; files written to /tmp, /var/tmp, /dev/shm are NOT removed (no dedicated uid)"))))
    rows.append(("job folders", "private to each sandbox's uid" if root else
                 ("private to the sandbox (only its own folders are mounted)" if bwrap else
                  "readable by every worker (all run as the grader's user)")))
    rows.append(("time", "per step from the job (cell and exercise limits), and a total per submission"))
    rows.append(("method checks", "static policy on the answer cells' source (see book/instructors.md)"))
    return rows


def cmd_release(args) -> int:
    root = find_root()
    name = _check_assignment(root, args.assignment)
    proc = _nbgrader(root, "generate_assignment", name, "--force", db_url=args.db)
    if proc.returncode:
        print(proc.stdout + proc.stderr, file=sys.stderr)
        return EXIT_FAILURES
    print(f"released {name} -> notebooks/{name}/ (registered in the gradebook)")
    if args.exchange:
        proc = _nbgrader(root, "release_assignment", name, "--force", db_url=args.db)
        print(proc.stdout + proc.stderr)
        return EXIT_FAILURES if proc.returncode else EXIT_OK
    return EXIT_OK


def cmd_collect(args) -> int:
    from .classroom import SAFE_ID
    from .exchange import supersede

    root = find_root()
    name = _check_assignment(root, args.assignment)
    if args.exchange:
        proc = _nbgrader(root, "collect", name, "--update", db_url=args.db)
        print(proc.stdout + proc.stderr)
        return EXIT_FAILURES if proc.returncode else EXIT_OK
    if args.zips:
        dest = root / "autograder" / "downloaded" / name / "archive"
        dest.mkdir(parents=True, exist_ok=True)
        for z in Path(args.zips).glob("*.zip"):
            shutil.copy(z, dest)
        proc = _nbgrader(root, "zip_collect", name, "--force", db_url=args.db)
        print(proc.stdout + proc.stderr)
        return EXIT_FAILURES if proc.returncode else EXIT_OK
    src = Path(args.from_dir)
    if not src.is_dir():
        raise UsageError(f"--from {src}: not a folder (expected <folder>/<student>/<files>)")
    submitted = root / "autograder" / "submitted"
    n, bad, skipped = 0, [], []
    for student_dir in sorted(p for p in src.iterdir() if p.is_dir()):
        student = student_dir.name
        if not SAFE_ID.match(student):
            bad.append(student)
            continue
        dest = submitted / student / name
        if dest.exists():  # keep what was there: nothing a student handed in is ever deleted
            supersede(dest, student, name)
        shutil.copytree(student_dir, dest, ignore=_unsafe_names(skipped, student))
        if not (dest / "timestamp.txt").exists():
            (dest / "timestamp.txt").write_text(time.strftime("%Y-%m-%d %H:%M:%S.000000 %Z"))
        n += 1
    print(f"collected {n} submissions of {name} into {submitted.relative_to(root)}/<student>/{name}/")
    for b in bad:
        print(f"  skipped folder {b!r}: student ids may use letters, digits, _ . @ - only", file=sys.stderr)
    for s in skipped:
        print(f"  not copied: {s} (only regular files and folders are collected)", file=sys.stderr)
    return EXIT_FAILURES if bad or skipped else EXIT_OK


def _unsafe_names(skipped: list, student: str):
    """A copytree ``ignore`` that leaves out links, FIFOs and devices (a link would be followed)."""
    import stat

    def ignore(folder, names):
        out = []
        for name in names:
            mode = os.lstat(os.path.join(folder, name)).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                out.append(name)
                skipped.append(f"{student}/.../{name}")
        return out

    return ignore


def cmd_autograde(args) -> int:
    from .classroom import Course, grade_class, shard

    root = find_root()
    name = _check_assignment(root, args.assignment)
    course = Course(root, args.db)
    students = args.student or course.students_with(name)
    missing = [s for s in students if s not in course.students_with(name)]
    if missing:
        raise UsageError(f"no submission of {name} for: {', '.join(missing)}")
    students = shard(students, args.shard)
    refused = _isolation_refused(args)
    if refused:
        print(f"ptgrade: {refused}", file=sys.stderr)
        return EXIT_ENV
    todo = students if args.force else [s for s in students if course.needs_grading(s, name)]
    skipped = len(students) - len(todo)
    if skipped:
        print(f"{skipped} submissions already graded (use --force to regrade them)")
    if not todo:
        print("nothing to grade")
        return EXIT_OK
    proc = _nbgrader(root, "db", "assignment", "add", name, db_url=args.db)  # idempotent
    if proc.returncode:
        print(proc.stdout + proc.stderr, file=sys.stderr)
        return EXIT_ENV
    if not _registered(root, name, args.db):
        proc = _nbgrader(root, "generate_assignment", name, "--force", db_url=args.db)
        if proc.returncode:
            print(proc.stdout + proc.stderr, file=sys.stderr)
            return EXIT_ENV
    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()] if args.gpus else []
    workers = args.workers or max(1, len(gpus))
    t0 = time.perf_counter()
    results = grade_class(course, name, todo, workers=workers, isolation=args.isolation, device=args.device,
                          gpus=gpus, progress=not args.quiet, allow_weak=args.allow_weak_isolation,
                          submission_s=args.submission_time_limit or 0.0)
    wall = time.perf_counter() - t0
    failed = [r for r in results if not r["success"]]
    print(f"graded {len(results) - len(failed)} of {len(results)} submissions of {name} in {wall:.1f} s "
          f"with {workers} worker(s)")
    for r in failed:
        print(f"  NOT GRADED {r['student']}: {r['error'].strip()[-300:]}", file=sys.stderr)
    if not args.quiet:
        from .summary import load_failures, load_reports, summarize

        print(summarize(load_reports(course.reports, name), name, root / "autograder" / "reports" / f"{name}-scores.png",
                        load_failures(course.reports, name)))
    return EXIT_FAILURES if failed else EXIT_OK


def _isolation_refused(args) -> str:
    """Why grades of record cannot be taken here ("" when they can), before any worker starts."""
    from ..device import pick_device
    from .isolation import WeakIsolationRefused, require_strong_isolation, resolve_isolation

    try:
        mode, why = resolve_isolation(args.isolation, pick_device(None if args.device == "auto" else args.device))
        require_strong_isolation(mode, why, args.allow_weak_isolation)
    except (RuntimeError, WeakIsolationRefused) as e:
        return str(e)
    if mode != "bwrap":
        print(f"WARNING: grading with WEAK (process) isolation, as --allow-weak-isolation asked: {why}", file=sys.stderr)
    return ""


def _registered(root: Path, name: str, db_url: str | None) -> bool:
    from nbgrader.api import Gradebook, MissingEntry

    from .nbgrader_plugin import normalize_db_url

    db = normalize_db_url(db_url or os.environ.get("PTGRADE_DB_URL") or f"sqlite:///{root}/autograder/gradebook.db")
    with Gradebook(db) as gb:
        try:
            return bool(gb.find_assignment(name).notebooks)
        except MissingEntry:
            return False


def cmd_feedback(args) -> int:
    root = find_root()
    name = _check_assignment(root, args.assignment)
    # nbgrader takes one --student (the last one given wins): several are one run each
    runs = [[f"--student={s}"] for s in dict.fromkeys(args.student)] if args.student else [[]]
    failed = []
    for extra in runs:
        proc = _nbgrader(root, "generate_feedback", name, "--force", *extra, db_url=args.db)
        if proc.returncode:
            failed.append(extra[0].split("=", 1)[1] if extra else "all")
            print(proc.stdout + proc.stderr, file=sys.stderr)
    if failed:
        print(f"ptgrade: no feedback for: {', '.join(failed)}", file=sys.stderr)
        return EXIT_FAILURES
    print(f"feedback written to autograder/feedback/<student>/{name}/"
          + (f" for {', '.join(args.student)}" if args.student else ""))
    if args.exchange:
        proc = _nbgrader(root, "release_feedback", name, db_url=args.db)
        print(proc.stdout + proc.stderr)
        return EXIT_FAILURES if proc.returncode else EXIT_OK
    return EXIT_OK


def cmd_export(args) -> int:
    root = find_root()
    out = Path(args.to).resolve()
    proc = _nbgrader(root, "export", f"--to={out}", db_url=args.db)
    if proc.returncode:
        print(proc.stdout + proc.stderr, file=sys.stderr)
        return EXIT_FAILURES
    print(f"grades exported to {out}")
    return EXIT_OK


def cmd_summary(args) -> int:
    from .summary import load_failures, load_reports, summarize

    root = find_root()
    name = _check_assignment(root, args.assignment)
    reports = root / "autograder" / "reports"
    print(summarize(load_reports(reports, name), name, reports / f"{name}-scores.png", load_failures(reports, name)))
    return EXIT_OK


def cmd_validate(args) -> int:
    from .validate import validate_notebook

    problems = validate_notebook(Path(args.notebook))
    if problems:
        print("Problems found (the grader will restore deleted or edited test cells, but check your work):")
        for p in problems:
            print(f"  - {p}")
        return EXIT_FAILURES
    print("OK: every answer cell and test cell is present, and no test cell was edited.")
    return EXIT_OK


def cmd_student_edition(args) -> int:
    """Build the student edition (ptinternals.edition.build); kept apart from the grading commands."""
    from ..edition.build import build
    from ..edition.checks import EditionError

    root = find_root()
    try:
        report = build(Path(args.out), root, wheel=not args.no_wheel, jobs=args.jobs, chapters=args.chapter)
    except EditionError as e:
        print(f"ptgrade: the student edition was not built: {e}", file=sys.stderr)
        return EXIT_FAILURES
    scan = report.scan
    print(f"student edition written to {report.out} ({len(report.files)} files; see EDITION.md)")
    if report.wheel:
        print(f"  wheel: {report.wheel}")
    print(f"  clean scan: {scan.bodies} solution bodies and {scan.fragments} blocks searched in {scan.texts} Python "
          f"texts of {scan.files} files: {len(scan.findings)} found")
    print("  " + ", ".join(f"{k} {v:.0f} s" for k, v in report.seconds.items()))
    return EXIT_OK


# ---- parser ------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ptgrade", description=__doc__.split("\n\n")[0],
                                epilog="Run `ptgrade <command> --help` for a command's options.")
    sub = p.add_subparsers(dest="command", required=True, metavar="command")

    def add(name, fn, help_):
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.set_defaults(fn=fn)
        return sp

    sp = add("doctor", cmd_doctor, "report what grading here will use: versions, device, isolation, scheduler "
             "task and shard, gradebook (exit 3 if this machine cannot grade)")
    sp.add_argument("--isolation", choices=["auto", "bwrap", "process"], default="auto")
    sp.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    sp.add_argument("--db", help="gradebook URL to check (default: $PTGRADE_DB_URL or sqlite)")
    sp.add_argument("--assignment", help="also report its submissions in this task's shard and whether it is registered")
    sp = add("release", cmd_release, "generate the student notebook and register the assignment")
    sp.add_argument("assignment")
    sp.add_argument("--exchange", action="store_true", help="also release to nbgrader's exchange (JupyterHub)")
    sp.add_argument("--db", help="gradebook URL (default: sqlite file, or $PTGRADE_DB_URL)")
    sp = add("collect", cmd_collect, "import submissions into autograder/submitted/")
    sp.add_argument("assignment")
    src = sp.add_mutually_exclusive_group(required=True)
    src.add_argument("--from", dest="from_dir", help="a folder of <student>/<notebook and answers files>")
    src.add_argument("--exchange", action="store_true", help="nbgrader collect from the exchange")
    src.add_argument("--zips", help="a folder of LMS zip downloads (nbgrader zip_collect)")
    sp.add_argument("--db")
    sp = add("autograde", cmd_autograde, "grade submissions through the trusted sandbox")
    sp.add_argument("assignment")
    sp.add_argument("--student", action="append", help="grade only this student (repeatable)")
    sp.add_argument("-j", "--workers", type=int, default=0, help="parallel workers (default 1, or one per GPU)")
    sp.add_argument("--gpus", help="comma-separated GPU indices; worker k uses gpus[k %% n]")
    sp.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    sp.add_argument("--isolation", choices=["auto", "bwrap", "process"], default="auto",
                    help="how student code is isolated (bubblewrap unless --allow-weak-isolation says otherwise)")
    sp.add_argument("--allow-weak-isolation", action="store_true",
                    help="record grades even without bubblewrap (process isolation: student code can read the "
                         "sandbox user's files and reach packages an exercise forbids); off by default")
    sp.add_argument("--submission-time-limit", type=float, metavar="SECONDS",
                    help="most time one submission may take, all its sandbox runs together (default: derived from "
                         "its exercises' limits)")
    sp.add_argument("--shard", help="i/N: grade every N-th submission starting at i; auto: this Slurm array task's or "
                    "Kubernetes Indexed Job pod's shard (see ptgrade doctor)")
    sp.add_argument("--force", action="store_true", help="regrade submissions that are already graded")
    sp.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    sp.add_argument("--db", help="gradebook URL, e.g. postgresql://user@host/db (default: $PTGRADE_DB_URL or sqlite)")
    sp = add("feedback", cmd_feedback, "write HTML feedback (hidden tests removed)")
    sp.add_argument("assignment")
    sp.add_argument("--student", action="append", help="only this student (repeatable)")
    sp.add_argument("--exchange", action="store_true", help="also release feedback to the exchange")
    sp.add_argument("--db")
    sp = add("export", cmd_export, "export the gradebook to CSV")
    sp.add_argument("--to", default="grades.csv")
    sp.add_argument("--db")
    sp = add("summary", cmd_summary, "pass rates, score histogram, slowest submissions, failure categories")
    sp.add_argument("assignment")
    sp = add("validate", cmd_validate, "(students) check that no test cell was deleted or edited")
    sp.add_argument("notebook")
    sp = add("student-edition", cmd_student_edition,
             "build the student edition: notebooks, student package and wheel, without solutions (see EDITION.md)")
    sp.add_argument("--out", required=True, help="the folder to write (emptied first if it holds an earlier edition)")
    sp.add_argument("--no-wheel", action="store_true", help="skip building the wheel")
    sp.add_argument("-j", "--jobs", type=int, default=2, help="notebooks recorded in parallel (default 2)")
    sp.add_argument("--chapter", action="append", help="only this chapter (repeatable; default: every chapter)")
    return p


def main(argv=None) -> int:
    # nbgrader runs `alembic` (and the workers run nbgrader) from PATH: make this environment's bin first.
    from ..device import use_triton_interpreter_without_gpu

    use_triton_interpreter_without_gpu()
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "workers", 0) and args.workers < 0:
        parser.error("--workers must be >= 1")
    if getattr(args, "submission_time_limit", None) is not None and not args.submission_time_limit > 0:
        parser.error(f"--submission-time-limit must be > 0 seconds, got {args.submission_time_limit}")
    try:
        return args.fn(args)
    except UsageError as e:
        print(f"ptgrade: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as e:
        print(f"ptgrade: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("ptgrade: interrupted; finished grades are saved, rerun to grade the rest", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
