"""Fixtures for grading tests: submissions built from the strides chapter's solution notebook."""
import os
import shutil
import socket
import subprocess
from pathlib import Path

import nbformat
import pytest

from ptinternals.grading.testing import ROOT, notebook_with


def submission(replace: dict | None = None, delete: tuple = (), student_version: bool = False):
    """The strides chapter notebook with some answer cells replaced (by grade_id) or deleted."""
    return notebook_with("strides", replace, delete, student=student_version)


def make_course(root: Path) -> Path:
    """A throw-away course folder with this repository's solutions and nbgrader config."""
    (root / "autograder").mkdir(parents=True)
    shutil.copytree(ROOT / "solutions", root / "solutions")
    shutil.copy(ROOT / "autograder" / "nbgrader_config.py", root / "autograder")
    return root


class _Root:
    """Point ptgrade at a course folder (PTGRADE_ROOT) for the duration of a fixture."""

    def __init__(self, root):
        self.root, self.old = root, os.environ.get("PTGRADE_ROOT")

    def __enter__(self):
        os.environ["PTGRADE_ROOT"] = str(self.root)
        return self.root

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop("PTGRADE_ROOT", None)
        else:
            os.environ["PTGRADE_ROOT"] = self.old


@pytest.fixture
def course(tmp_path):
    with _Root(make_course(tmp_path / "course")) as root:
        yield root


@pytest.fixture(scope="module")
def module_course(tmp_path_factory):
    with _Root(make_course(tmp_path_factory.mktemp("course") / "course")) as root:
        yield root


def add_submission(root: Path, student: str, nb, answers: dict | None = None, assignment: str = "strides"):
    import json

    dest = root / "autograder" / "submitted" / student / assignment
    dest.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest / f"{assignment}.ipynb")
    (dest / "timestamp.txt").write_text("2026-11-30 12:00:00.000000 UTC")
    if answers is not None:
        (dest / f"{assignment}.answers.json").write_text(json.dumps(
            {"format": 1, "chapter": assignment, "answers": {q: [{"answer": a, "at": 0}] for q, a in answers.items()}}))
    return dest


# ---- PostgreSQL: a private server for concurrent grading (test_classroom.py, test_slurm.py) ----------------
def _pg_bin(name: str) -> str | None:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    return str(found[-1]) if found else shutil.which(name)


@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    """A private PostgreSQL server (Debian's package; .ci/run installs it) on a Unix socket."""
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("PostgreSQL server binaries are not installed (apt-get install postgresql)")
    base = tmp_path_factory.mktemp("pg")
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    run_as = []
    if os.geteuid() == 0:  # the server refuses to run as root
        import pwd

        user = pwd.getpwnam("postgres") if "postgres" in {p.pw_name for p in pwd.getpwall()} else None
        if user is None:
            pytest.skip("running as root without a 'postgres' user")
        os.chmod(base, 0o777)
        os.chown(sock, user.pw_uid, user.pw_gid)
        for p in [base, *base.parents]:
            if p == Path("/"):
                break
            os.chmod(p, os.stat(p).st_mode | 0o011)  # let the postgres user traverse to the folder
        run_as = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run(run_as + [initdb, "-D", str(data), "-A", "trust", "-U", "grader", "--no-sync"], check=True,
                   capture_output=True)
    subprocess.run(run_as + [pg_ctl, "-D", str(data), "-l", str(base / "log"), "-w", "start", "-o",
                             f"-p {port} -k {sock} -c listen_addresses='' -c max_connections=50 -c fsync=off"],
                   check=True, capture_output=True)
    subprocess.run(run_as + [_pg_bin("createdb") or "createdb", "-h", str(sock), "-p", str(port), "-U", "grader",
                             "course"], check=True, capture_output=True)
    yield f"postgresql://grader@/course?host={sock}&port={port}"
    subprocess.run(run_as + [pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
