"""What a sandboxed process can see and who it runs as.

* :func:`build_site`: the sandbox's copy of the course package, the allowed helpers only (no reference);
* :func:`absent_paths`: every place on the sandbox's filesystem a forbidden package (torch, numpy)
  could be loaded from, so that bubblewrap mounts empty folders (or ``/dev/null``) over them;
* :func:`bwrap_args`: the bubblewrap command line (read-only system, size-limited ``/tmp`` and
  ``/dev/shm``, no network, the job and a scratch folder);
* :class:`UidLease` and :func:`preexec`: a dedicated unprivileged uid per running sandbox (root grader),
  the rlimits, the cgroup, and the new network namespace of process isolation.
"""
from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

# ABSENTABLE: the packages a "forbid" makes absent here; defined beside Exercise.forbid, where the checking
# client reads it too (grading.policy, which the student edition ships without this module).
from .exercise import ABSENTABLE
from .resources import kill_until_gone

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # .../ptinternals

# What graded code may import from the course package: helpers, never a chapter's reference.
ALLOWED_FILES = (
    "__init__.py",
    "device.py",
    "benchmark.py",
    "grading/__init__.py",
    "grading/_runtime.py",
    "checks/probes/*.py",
)

UID_BASE = 61000  # sandboxes run as uids UID_BASE .. UID_BASE + UID_COUNT - 1 (when the grader is root)
UID_COUNT = 1000
UID_LOCK_DIR = Path(tempfile.gettempdir()) / "ptgrade-uids"



# ================================================================================================
# The sandbox's copy of the course package
# ================================================================================================
def build_site(dest: Path, extra_files: tuple[str, ...] = ()) -> list[str]:
    """Copy the allowed modules into ``dest/ptinternals``; return their module names.

    ``extra_files`` are a chapter's scaffolding modules (``Chapter.sandbox_files``, e.g.
    ``"autograd/scaffold.py"``): code the exercises build on that is not a solution. Their chapter
    package becomes a namespace package without its ``__init__`` (which imports the reference).
    """
    names = []
    for pattern in (*ALLOWED_FILES, *extra_files):
        for src in sorted(PACKAGE_ROOT.glob(pattern)):
            rel = src.relative_to(PACKAGE_ROOT)
            target = dest / "ptinternals" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)
            parts = ["ptinternals", *rel.with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join(parts))
            names += [".".join(parts[:k]) for k in range(1, len(parts))]  # parent packages
    return sorted(set(names))


def site_packages_dirs() -> list[str]:
    """The interpreter's site-packages (torch, numpy, triton live there); the course package is not added."""
    import site

    dirs = [p for p in site.getsitepackages() if os.path.isdir(p)]
    return [d for d in dirs if not (Path(d) / "ptinternals" / "strides").exists()] + \
           [d for d in dirs if (Path(d) / "ptinternals" / "strides").exists()]


def _hidden_reference_dirs() -> list[str]:
    """Installed (non-editable) copies of the course package, hidden inside bwrap."""
    import site

    return [str(Path(d) / "ptinternals") for d in site.getsitepackages() if (Path(d) / "ptinternals").is_dir()]


def _bound_prefixes() -> list[str]:
    """The interpreter's folders outside /usr that bubblewrap binds (the venv, a non-system Python)."""
    out = []
    for prefix in sorted({sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))}):
        if not prefix.startswith("/usr"):
            out.append(prefix)
    return out


def _matches(name: str, module: str) -> bool:
    if name in ABSENTABLE[module]:
        return True
    if name.startswith(module + "-") and name.endswith((".dist-info", ".egg-info", ".egg", ".whl", ".zip")):
        return True
    return module == "torch" and re.match(r"lib(torch|c10)[\w.-]*\.so", name) is not None


@lru_cache(maxsize=None)
def absent_paths(modules: tuple[str, ...], max_depth: int = 8) -> tuple[str, ...]:
    """Every folder or file under what bubblewrap mounts (/usr and the interpreter's prefixes) from which
    one of ``modules`` could be imported or loaded: the packages, their bundled libraries, their
    metadata. The walk follows no links and stops at a match."""
    modules = tuple(m for m in modules if m in ABSENTABLE)
    found: list[str] = []
    if not modules:
        return ()
    for root in ["/usr", *_bound_prefixes()]:
        stack = [(root, 0)]
        while stack:
            folder, depth = stack.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                if any(_matches(entry.name, m) for m in modules):
                    found.append(entry.path)
                    continue
                try:
                    if entry.is_dir(follow_symlinks=False) and depth < max_depth:
                        stack.append((entry.path, depth + 1))
                except OSError:
                    continue
    return tuple(sorted(set(found)))


# ================================================================================================
# bubblewrap
# ================================================================================================
def bwrap_args(job_dir: Path, out_dir: Path, site_dir: Path, device: str, *, hide: tuple[str, ...] = (),
               tmp_mb: int = 256) -> list[str]:
    """The bubblewrap command line: a read-only system, the job and site read-only, the output folder
    writable, ``/tmp`` and ``/dev/shm`` size-limited tmpfs, and ``hide`` (absent packages) emptied."""
    size = str(tmp_mb << 20)
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session",
            "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev",
            "--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", "/dev/shm"]
    for link in ("bin", "lib", "lib64", "sbin"):
        target = os.path.join("/", link)
        if os.path.islink(target):
            args += ["--symlink", os.readlink(target), target]
        elif os.path.isdir(target):
            args += ["--ro-bind", target, target]
    for path in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives"):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    for prefix in _bound_prefixes():
        args += ["--ro-bind", prefix, prefix]
    for hidden in _hidden_reference_dirs():
        args += ["--tmpfs", hidden, "--remount-ro", hidden]
    args += _without(hide)
    if device == "cuda":
        for dev in sorted(Path("/dev").glob("nvidia*")):
            args += ["--dev-bind", str(dev), str(dev)]
        for path in ("/usr/local/nvidia", "/usr/local/cuda", "/sys", "/etc/nvidia", "/run/nvidia-persistenced"):
            if os.path.exists(path):
                args += ["--ro-bind", path, path]
    args += ["--ro-bind", str(job_dir), "/sandbox/job", "--ro-bind", str(site_dir), "/sandbox/site",
             "--bind", str(out_dir), "/sandbox/out", "--chdir", "/sandbox/out"]
    return args


def _without(hide: tuple[str, ...]) -> list[str]:
    """Mount arguments under which the paths in ``hide`` do not exist.

    An empty folder mounted over a package would still import (as a namespace package), so each
    folder holding a hidden entry is replaced by an empty tmpfs into which every *other* entry is
    bound back (links recreated as links), then made read-only.
    """
    args: list[str] = []
    by_parent: dict[str, set[str]] = {}
    for path in hide:
        by_parent.setdefault(os.path.dirname(path), set()).add(os.path.basename(path))
    for parent, names in sorted(by_parent.items()):
        try:
            entries = sorted(os.scandir(parent), key=lambda e: e.name)
        except OSError:
            continue
        args += ["--tmpfs", parent]
        for entry in entries:
            if entry.name in names:
                continue
            if entry.is_symlink():
                args += ["--symlink", os.readlink(entry.path), entry.path]
            else:
                args += ["--ro-bind", entry.path, entry.path]
        args += ["--remount-ro", parent]
    return args


@lru_cache(maxsize=None)
def bwrap_works(device: str = "cpu") -> tuple[bool, str]:
    """Probe once whether bubblewrap can run the interpreter here (and see the GPU when asked)."""
    if not shutil.which("bwrap"):
        return False, "bubblewrap (bwrap) is not installed"
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o777)
        code = "import sys; sys.path[:0]=%r; import torch; print(torch.cuda.is_available())" % (site_packages_dirs(),)
        cmd = bwrap_args(Path(tmp), Path(tmp), Path(tmp), device) + [sys.executable, "-I", "-S", "-c", code]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                                  preexec_fn=preexec(_probe_limits(), _probe_uid(), device))
        except (OSError, subprocess.TimeoutExpired) as e:
            return False, f"bwrap failed to start: {e}"
        if proc.returncode != 0:
            return False, f"bwrap could not run the interpreter: {proc.stderr.strip()[-300:]}"
        if device == "cuda" and proc.stdout.strip() != "True":
            return False, "inside bwrap the GPU is not visible (device files or driver libraries missing)"
        return True, "bubblewrap works"


def _probe_limits():
    from .sandbox import Limits

    return Limits()


def resolve_isolation(requested: str, device: str) -> tuple[str, str]:
    """(mode, why) for ``requested`` in {auto, bwrap, process}."""
    if requested not in ("auto", "bwrap", "process"):
        raise ValueError(f"isolation must be 'auto', 'bwrap' or 'process', got {requested!r}")
    if requested == "process":
        return "process", "asked for"
    ok, why = bwrap_works(device)
    if ok:
        return "bwrap", why
    if requested == "bwrap":
        raise RuntimeError(f"isolation 'bwrap' was required but is unavailable: {why}")
    return "process", f"fallback: {why}"


class WeakIsolationRefused(RuntimeError):
    """Grades of record without bubblewrap, and the instructor did not say that is acceptable."""


def require_strong_isolation(mode: str, why: str, allow_weak: bool) -> None:
    """Refuse to record grades under process isolation unless ``--allow-weak-isolation`` was given."""
    if mode != "bwrap" and not allow_weak:
        raise WeakIsolationRefused(
            f"grading would use process isolation ({why}): student code could then read any file the sandbox "
            f"user can read (the course repository, other installs) and import packages an exercise forbids. "
            f"Install bubblewrap (apt-get install bubblewrap) or, knowingly, pass --allow-weak-isolation "
            f"(PTGRADE_ALLOW_WEAK_ISOLATION=1 for nbgrader's own commands).")


# ================================================================================================
# Who the sandbox runs as
# ================================================================================================
def _probe_uid() -> int | None:
    """The uid the probe uses (the top of the range, never leased)."""
    return UID_BASE + UID_COUNT - 1 if os.geteuid() == 0 else None


class UidLease:
    """A sandbox uid nobody else on this machine is using, held (flock) while the sandbox runs.

    Limits such as RLIMIT_NPROC count per uid, and the clean-up kills every process of the uid, so two
    graders (or two workers) must never share one: each run leases a free uid from a reserved range.
    Leasing a uid also clears what a grader that died while holding it left behind.
    """

    def __init__(self):
        self.uid, self._fd = None, None

    def __enter__(self) -> int | None:
        if os.geteuid() != 0:
            return None
        import fcntl

        UID_LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
        for uid in range(UID_BASE, UID_BASE + UID_COUNT - 16):
            fd = os.open(UID_LOCK_DIR / f"{uid}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self._fd = uid, fd
            kill_uid(uid)  # leftovers of a grader that died without cleaning up
            unmount_stale(uid)
            return uid
        raise RuntimeError(f"no free sandbox uid in {UID_BASE}..{UID_BASE + UID_COUNT}: too many graders at once")

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the flock


def pids_of_uid(uid: int) -> list[int]:
    """Live processes of ``uid`` (zombies are dead already: they hold nothing and wait to be reaped)."""
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            state = None
            for line in status.read_text().splitlines():
                if line.startswith("State:"):
                    state = line.split()[1]
                elif line.startswith("Uid:"):
                    if int(line.split()[1]) == uid and state not in ("Z", "X"):
                        pids.append(int(status.parent.name))
                    break
        except (OSError, ValueError, IndexError):
            continue
    return pids


def kill_uid(uid: int, timeout_s: float = 5.0) -> None:
    """Kill every process of the sandbox's dedicated uid (forks that left the session included)."""
    kill_until_gone(lambda: pids_of_uid(uid), timeout_s, poll_s=0.05)


# ================================================================================================
# The scratch folder: a size-limited tmpfs when the grader is root
# ================================================================================================
def mount_scratch(path: Path, size_mb: int, uid: int) -> bool:
    """Mount a tmpfs of ``size_mb`` on ``path``, owned by ``uid`` (root only). Its pages are charged to
    the memory cgroup of the process that writes them. False when it cannot be done."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    opts = f"size={size_mb}m,mode=0700,uid={uid},gid={uid},nosuid,nodev"
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "ptgrade-scratch", str(path)],
                          capture_output=True, text=True)
    return proc.returncode == 0


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def unmount_stale(uid: int) -> None:
    """Job folders (and scratch mounts) of a run with this uid that a killed grader left (``ptgrade-u<uid>-``)."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    marker = f"/ptgrade-u{uid}-"
    for line in mounts:
        fields = line.split()
        if len(fields) > 4 and marker in fields[4]:
            point = fields[4].encode().decode("unicode_escape")
            unmount(Path(point))
            shutil.rmtree(Path(point).parent, ignore_errors=True)
    for leftover in Path(tempfile.gettempdir()).glob(f"ptgrade-u{uid}-*"):
        shutil.rmtree(leftover, ignore_errors=True)


# ================================================================================================
# The child's set-up, between fork and exec
# ================================================================================================
CLONE_NEWNET = 0x40000000


def _unshare_network() -> bool:
    """Put this process in a new, empty network namespace (needs root; done before dropping uid)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.unshare(CLONE_NEWNET) == 0
    except OSError:
        return False


@lru_cache(maxsize=None)
def torch_address_space_mb() -> int:
    """Virtual address space (MiB, ``VmPeak``) of an interpreter that has imported torch and numpy, as the
    harness of a torch job does before any student code runs; 0 when that cannot be measured.

    ``RLIMIT_AS`` counts mappings, not memory: the CPU wheel of torch 2.13 maps about 0.6 GiB, PyPI's CUDA
    build (torch 2.11+cu130, the GPU machine's) about 3.1 GiB of shared libraries even with no GPU in sight.
    A torch job's ``RLIMIT_AS`` is therefore ``memory_mb`` plus this, so ``memory_mb`` means the same on
    every build (a 1.5 GiB limit no longer stops the CUDA build at ``import torch``)."""
    code = ("import sys; sys.path[:0] = %r; import numpy, torch\n"
            "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmPeak:')][0])"
            % (site_packages_dirs(),))
    env = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    try:
        proc = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True,
                              timeout=120, env=env)
        return -(-int(proc.stdout.split()[-1]) // 1024) if proc.returncode == 0 else 0  # kB, rounded up
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return 0


def preexec(limits, uid: int | None, device: str, isolate_net: bool = False, join=None, extra_address_space_mb=0):
    """The child's set-up: own session, cgroup (``join``), network namespace, rlimits, then the uid.
    ``extra_address_space_mb``: added to ``RLIMIT_AS`` only (:func:`torch_address_space_mb`)."""

    def setup():
        os.setsid()
        if join is not None:
            join()  # into the sandbox's cgroup, while still root
        if isolate_net and os.geteuid() == 0:
            _unshare_network()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 5))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.fsize_mb << 20, limits.fsize_mb << 20))
        if device != "cuda":  # CUDA maps far more virtual memory than it uses: watched by RSS instead
            address_space = (limits.memory_mb + extra_address_space_mb) << 20
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
        if uid is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.nproc, limits.nproc))
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        # Without a dedicated uid, RLIMIT_NPROC would count every process of the grader's user (threads
        # included), so it is not set: fork bombs are then stopped by the cgroup's pids.max (root) or
        # the wall-time kill.

    return setup
