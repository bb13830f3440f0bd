"""A multi-user JupyterHub's file side, for tests: nbgrader's filesystem exchange in a temporary root, an
instructor and a student each with a home (and, as root, each a Unix user of their own, as on a real hub).

Each user's ``~/.jupyter/nbgrader_config.py`` points at the exchange, as a hub's image would; commands run
as that user with that home, so nbgrader's exchange checks (owners, modes, the student's submission cache)
are the real ones. Without root both roles are the current user, in two homes.
"""
from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

COURSE = "ptinternals-test"
BIN = Path(sys.executable).parent  # the venv's bin: ptgrade, nbgrader


@dataclass
class User:
    name: str
    uid: int
    gid: int
    home: Path
    timings: list = field(default_factory=list)  # (command, seconds), for the test's report

    def env(self, **extra: str) -> dict:
        keep = {k: v for k, v in os.environ.items()
                if not k.startswith(("PTGRADE_", "JUPYTER", "SLURM_")) and k not in ("HOME", "USER", "LOGNAME", "TMPDIR")}
        return {**keep, "HOME": str(self.home), "USER": self.name, "LOGNAME": self.name, **extra}

    def run(self, *cmd, cwd: Path | None = None, env: dict | None = None, timeout: float = 600):
        as_user = {}
        if os.geteuid() == 0 and self.uid != 0:
            as_user = {"user": self.uid, "group": self.gid, "extra_groups": []}
        t0 = time.perf_counter()
        proc = subprocess.run([str(c) for c in cmd], cwd=cwd or self.home, env=self.env(**(env or {})), text=True,
                              capture_output=True, timeout=timeout, **as_user)
        self.timings.append((f"{self.name}: " + " ".join(Path(str(c)).name for c in cmd[:3]), time.perf_counter() - t0))
        if proc.returncode:
            raise AssertionError(f"{self.name}: {' '.join(map(str, cmd))} exited {proc.returncode}\n"
                                 f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        return proc.stdout + proc.stderr

    def give(self, path: Path) -> None:
        """Make ``path`` (recursively) this user's, as if they had written it."""
        if os.geteuid() != 0:
            return
        for p in [path, *path.rglob("*")]:
            os.lchown(p, self.uid, self.gid)


class LocalHub:
    def __init__(self):
        self.base = Path(tempfile.mkdtemp(prefix="ptg-hub-"))
        os.chmod(self.base, 0o755)
        self.exchange = self.base / "exchange"
        self.exchange.mkdir()
        os.chmod(self.exchange, 0o1777)  # as a hub admin creates it: everyone writes, the sticky bit guards
        tag, self._created = secrets.token_hex(3), []
        try:
            self.instructor = self._user(f"ptg-instructor-{tag}")
            self.student = self._user(f"ptg-student-{tag}")
        except BaseException:
            self.close()
            raise
        self.timings = self.instructor.timings = self.student.timings = []  # one log, in the order commands ran
        for user, extra in ((self.instructor, ""), (self.student, f"c.CourseDirectory.course_id = {COURSE!r}\n")):
            config = user.home / ".jupyter" / "nbgrader_config.py"
            config.parent.mkdir(parents=True)
            config.write_text(f"c = get_config()  # noqa: F821\nc.Exchange.root = {str(self.exchange)!r}\n{extra}")
            user.give(user.home)

    def check(self) -> None:
        """Both users must run the course's Python, as the grading sandbox's uids must."""
        if self.distinct_users:
            try:
                self.student.run(BIN / "python", "-c", "import ptinternals.quiz.answers")
            except AssertionError as e:
                raise AssertionError(f"another user cannot run {BIN / 'python'} with this repository's packages: the "
                                     f"repository and its .venv must be readable by other users\n{e}") from None

    @property
    def distinct_users(self) -> bool:
        return self.instructor.uid != self.student.uid

    def _user(self, name: str) -> User:
        home = self.base / name
        home.mkdir(mode=0o755)
        if os.geteuid() != 0:
            me = pwd.getpwuid(os.getuid())
            return User(me.pw_name, me.pw_uid, me.pw_gid, home)
        subprocess.run(["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/usr/sbin/nologin",
                        "--user-group", name], check=True, capture_output=True)
        self._created.append(name)
        entry = pwd.getpwnam(name)
        return User(name, entry.pw_uid, entry.pw_gid, home)

    def close(self) -> None:
        for name in reversed(self._created):  # every command ran to completion (subprocess.run): none left running
            subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)

