"""What a submission may use, counted by the kernel: memory (tmpfs and shared memory included) and
processes, through a control group; and what it leaves behind, removed after grading.

A root grader puts each sandbox in its own cgroup:

* cgroup v1 (``/sys/fs/cgroup/memory`` and ``/sys/fs/cgroup/pids`` hierarchies): ``memory.limit_in_bytes``
  (the memory controller also charges tmpfs and ``/dev/shm`` pages to the group that wrote them) and
  ``pids.max`` (processes and threads);
* cgroup v2 (a unified tree with the ``memory`` and ``pids`` controllers): ``memory.max``, ``pids.max``,
  and ``cgroup.kill``.

Without root (or without either tree) the sandbox keeps its rlimits only (``RLIMIT_AS`` per process,
no per-uid process count), and ``ptgrade doctor`` says so. :func:`remove_files_of_uid` deletes what a
dedicated sandbox uid wrote in the machine's shared writable folders (process isolation; in bubblewrap
those folders are the sandbox's own tmpfs and vanish with it).
"""
from __future__ import annotations

import itertools
import os
import shutil
import signal
import stat
import time
from functools import lru_cache
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "ptgrade"  # our groups live in <hierarchy>/ptgrade/<name>
_counter = itertools.count()


def kill_until_gone(list_pids, timeout_s: float = 5.0, poll_s: float = 0.02) -> None:
    """SIGKILL every process ``list_pids()`` names, again and again, until it names none or ``timeout_s``
    has passed (a process forked while the others die is caught by the next round)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = list_pids()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(poll_s)


@lru_cache(maxsize=None)
def cgroup_support() -> tuple[str | None, str]:
    """("v1" | "v2" | None, why): which cgroup tree this grader can use to limit a sandbox."""
    if os.geteuid() != 0:
        return None, "the grader is not root: no cgroup (memory per process via RLIMIT_AS only)"
    v1 = [CGROUP_ROOT / "memory", CGROUP_ROOT / "pids"]
    if all((d / "cgroup.procs").exists() for d in v1):
        try:
            for d in v1:
                (d / PARENT).mkdir(exist_ok=True)
            return "v1", "cgroup v1 memory and pids hierarchies"
        except OSError as e:
            return None, f"cgroup v1 hierarchies exist but are not writable ({e.strerror})"
    for root in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        controllers = root / "cgroup.controllers"
        if controllers.exists() and {"memory", "pids"} <= set(controllers.read_text().split()):
            try:
                parent = root / PARENT
                parent.mkdir(exist_ok=True)
                (root / "cgroup.subtree_control").write_text("+memory +pids")
                (parent / "cgroup.subtree_control").write_text("+memory +pids")
                return "v2", f"cgroup v2 at {root}"
            except OSError as e:
                return None, f"cgroup v2 at {root} is not usable ({e.strerror})"
    return None, "no cgroup tree with the memory and pids controllers is mounted"


def _v2_root() -> Path:
    return CGROUP_ROOT if (CGROUP_ROOT / "cgroup.controllers").exists() and \
        "memory" in (CGROUP_ROOT / "cgroup.controllers").read_text() else CGROUP_ROOT / "unified"


class Cgroup:
    """One sandbox's control group: created before the sandbox starts, removed after it is killed."""

    def __init__(self, memory_mb: int, pids: int):
        self.kind, _ = cgroup_support()
        self.name = f"s{os.getpid()}-{next(_counter)}-{int(time.time() * 1000) % 10**8}"
        self.memory_bytes, self.pids = memory_mb << 20, pids
        self.dirs: list[Path] = []

    def __enter__(self) -> Cgroup:
        if self.kind == "v1":
            mem, pids = CGROUP_ROOT / "memory" / PARENT / self.name, CGROUP_ROOT / "pids" / PARENT / self.name
            mem.mkdir()
            self.dirs = [mem]
            pids.mkdir()
            self.dirs.append(pids)
            (mem / "memory.limit_in_bytes").write_text(str(self.memory_bytes))
            if (mem / "memory.memsw.limit_in_bytes").exists():  # swap counted too, where accounted
                (mem / "memory.memsw.limit_in_bytes").write_text(str(self.memory_bytes))
            (pids / "pids.max").write_text(str(self.pids))
        elif self.kind == "v2":
            d = _v2_root() / PARENT / self.name
            d.mkdir()
            self.dirs = [d]
            (d / "memory.max").write_text(str(self.memory_bytes))
            if (d / "memory.swap.max").exists():
                (d / "memory.swap.max").write_text("0")
            (d / "pids.max").write_text(str(self.pids))
        return self

    def join_fn(self):
        """A function for the child (before exec, still root) that moves it into the group."""
        paths = [str(d / "cgroup.procs") for d in self.dirs]

        def join():
            pid = str(os.getpid())
            for p in paths:
                with open(p, "w") as f:
                    f.write(pid)

        return join

    def pids_in(self) -> list[int]:
        out = set()
        for d in self.dirs:
            try:
                out |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
            except (OSError, ValueError):
                continue
        return sorted(out)

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the group for memory (or refused it memory)."""
        for d in self.dirs:
            for name in ("memory.oom_control", "memory.events"):
                try:
                    for line in (d / name).read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill" and int(value) > 0:
                            return True
                except (OSError, ValueError):
                    continue
        return False

    def kill_all(self, timeout_s: float = 5.0) -> None:
        if self.kind == "v2" and self.dirs and (self.dirs[0] / "cgroup.kill").exists():
            try:
                (self.dirs[0] / "cgroup.kill").write_text("1")
            except OSError:
                pass
        kill_until_gone(self.pids_in, timeout_s)

    def __exit__(self, *exc) -> None:
        self.kill_all()
        for d in reversed(self.dirs):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # busy for a moment after its last process exits
                    time.sleep(0.02)


class NoCgroup:
    """Stands in for :class:`Cgroup` where none can be used."""

    kind = None
    dirs: list = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def join_fn(self):
        return None

    def pids_in(self):
        return []

    def oom_killed(self):
        return False

    def kill_all(self, timeout_s: float = 5.0):
        return None


def cgroup_for(memory_mb: int, pids: int):
    return Cgroup(memory_mb, pids) if cgroup_support()[0] else NoCgroup()


# ================================================================================================
# Leftovers of a dedicated uid in the machine's shared writable folders (process isolation)
# ================================================================================================
SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")


def remove_files_of_uid(uid: int, roots=SHARED_WRITABLE, max_entries: int = 200_000) -> int:
    """Delete everything owned by ``uid`` under ``roots``; return how many entries were removed.

    A uid can only create entries in folders it may write: world-writable ones (``/tmp`` and the
    like, and world-writable folders inside them, which are searched) and its own (removed whole).
    Links are never followed. Run after every process of the uid is dead, so nothing races it.
    """
    removed, seen = 0, 0
    stack = [r for r in roots if os.path.isdir(r) and not os.path.islink(r)]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > max_entries:
                return removed
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_uid == uid:
                try:
                    if stat.S_ISDIR(st.st_mode):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)
                    removed += 1
                except OSError:
                    pass
            elif stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH:
                stack.append(entry.path)
    return removed
