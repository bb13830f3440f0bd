"""Starting the grading sandbox: a fresh process, with limits, that sees only what it must.

Student code runs in a new process (``_runtime.py``) started from here with:

* **limits**: wall time (the process group is killed), CPU time (``RLIMIT_CPU``), memory
  (``RLIMIT_AS`` on the CPU; on a GPU, where CUDA reserves huge virtual ranges, a resident-memory
  watchdog instead), process count (``RLIMIT_NPROC``, per dedicated uid), file size (``RLIMIT_FSIZE``);
* **isolation**, the strongest available:

  ``bwrap``    bubblewrap: no network, read-only system, only the interpreter, the job and a scratch
               folder mounted; the course repository (solutions, gradebook) does not exist inside.
               Run as root, the grader also drops to a dedicated uid per worker.
  ``process``  a plain subprocess with the same limits, a scrubbed environment and ``-I -S`` (no
               site-packages path hooks), and no network when run as root (``unshare --net``).
               Weaker: code can read files the grader's user can read. ``ptgrade doctor`` says which
               mode a machine gets; ``--isolation bwrap`` refuses to grade without it.

* **no reference implementation**: the sandbox's ``ptinternals`` is a copy of the allowed helper
  modules only (``ALLOWED_FILES``); importing a chapter's reference raises ImportError.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

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

UID_BASE = 61000  # worker k runs student code as uid UID_BASE + k (when the grader is root)


@dataclass
class Limits:
    wall_s: float = 120.0
    cpu_s: int = 240
    memory_mb: int = 4096
    nproc: int = 64
    fsize_mb: int = 64
    threads: int = 1  # OMP/MKL threads inside the sandbox (workers run in parallel)


@dataclass
class SandboxResult:
    returncode: int | None
    signal: int | None
    timed_out: bool
    memory_exceeded: bool
    wall_s: float
    isolation: str
    out_dir: Path
    stdout_tail: str = ""
    stderr_tail: str = ""

    @property
    def crashed(self) -> bool:
        return self.timed_out or self.memory_exceeded or self.returncode != 0

    def describe(self) -> str:
        if self.timed_out:
            return f"ran past the {self.wall_s:.0f} s wall-time limit and was stopped"
        if self.memory_exceeded:
            return "used more memory than the limit and was stopped"
        if self.signal:
            name = signal.Signals(self.signal).name if self.signal in signal.Signals._value2member_map_ else str(self.signal)
            return f"crashed with signal {name}"
        if self.returncode:
            return f"exited with status {self.returncode}"
        return "finished"


@dataclass
class SandboxConfig:
    isolation: str = "auto"  # auto | bwrap | process
    device: str = "cpu"
    worker: int = 0
    limits: Limits = field(default_factory=Limits)
    keep: bool = False  # keep the job folder (debugging)
    base_dir: str | None = None


# ================================================================================================
# What the sandbox can see
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


# ================================================================================================
# Isolation
# ================================================================================================
@lru_cache(maxsize=None)
def bwrap_works(device: str = "cpu") -> tuple[bool, str]:
    """Probe once whether bubblewrap can run the interpreter here (and see the GPU when asked)."""
    if not shutil.which("bwrap"):
        return False, "bubblewrap (bwrap) is not installed"
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o777)
        code = "import sys; sys.path[:0]=%r; import torch; print(torch.cuda.is_available())" % (site_packages_dirs(),)
        cmd = _bwrap_prefix(Path(tmp), Path(tmp), Path(tmp), device) + [sys.executable, "-I", "-S", "-c", code]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                                  preexec_fn=_preexec(Limits(), _sandbox_uid(0), device))
        except (OSError, subprocess.TimeoutExpired) as e:
            return False, f"bwrap failed to start: {e}"
        if proc.returncode != 0:
            return False, f"bwrap could not run the interpreter: {proc.stderr.strip()[-300:]}"
        if device == "cuda" and proc.stdout.strip() != "True":
            return False, "inside bwrap the GPU is not visible (device files or driver libraries missing)"
        return True, "bubblewrap works"


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


UID_COUNT = 1000  # uids UID_BASE .. UID_BASE + UID_COUNT - 1 are reserved for sandboxes
UID_LOCK_DIR = Path(tempfile.gettempdir()) / "ptgrade-uids"


def _sandbox_uid(worker: int) -> int | None:
    """The uid the probe uses (no processes are killed by uid for it)."""
    return UID_BASE + UID_COUNT - 1 - worker if os.geteuid() == 0 else None


class UidLease:
    """A sandbox uid nobody else on this machine is using, held (flock) while the sandbox runs.

    Limits such as RLIMIT_NPROC count per uid, and the clean-up kills every process of the uid, so two
    graders (or two workers) must never share one: each run leases a free uid from a reserved range.
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
            _kill_uid(uid)  # leftovers of a grader that died without cleaning up
            return uid
        raise RuntimeError(f"no free sandbox uid in {UID_BASE}..{UID_BASE + UID_COUNT}: too many graders at once")

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the flock


def _bwrap_prefix(job_dir: Path, out_dir: Path, site_dir: Path, device: str) -> list[str]:
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session",
            "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for link in ("bin", "lib", "lib64", "sbin"):
        target = os.path.join("/", link)
        if os.path.islink(target):
            args += ["--symlink", os.readlink(target), target]
        elif os.path.isdir(target):
            args += ["--ro-bind", target, target]
    for path in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives"):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    for prefix in {sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))}:
        if prefix.startswith("/usr"):
            continue
        args += ["--ro-bind", prefix, prefix]
    for hidden in _hidden_reference_dirs():
        args += ["--tmpfs", hidden]
    if device == "cuda":
        for dev in sorted(Path("/dev").glob("nvidia*")):
            args += ["--dev-bind", str(dev), str(dev)]
        for path in ("/usr/local/nvidia", "/usr/local/cuda", "/sys", "/etc/nvidia", "/run/nvidia-persistenced"):
            if os.path.exists(path):
                args += ["--ro-bind", path, path]
    args += ["--ro-bind", str(job_dir), "/sandbox/job", "--ro-bind", str(site_dir), "/sandbox/site",
             "--bind", str(out_dir), "/sandbox/out", "--chdir", "/sandbox/out"]
    return args


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


def _preexec(limits: Limits, uid: int | None, device: str, isolate_net: bool = False):
    def setup():
        os.setsid()
        if isolate_net and os.geteuid() == 0:
            _unshare_network()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 5))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.fsize_mb << 20, limits.fsize_mb << 20))
        if device != "cuda":  # CUDA maps far more virtual memory than it uses: watched by RSS instead
            resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb << 20, limits.memory_mb << 20))
        if uid is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.nproc, limits.nproc))
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        # Without a dedicated uid, RLIMIT_NPROC would count every process of the grader's user (threads
        # included), so it is not set: fork bombs are then stopped only by the wall-time kill.

    return setup


def _group_rss_mb(pgid: int) -> float:
    """Resident memory of every process in the sandbox's session (Linux /proc)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == pgid:  # field 5 (pgrp) counted after the ")"
                total += int(fields[21]) * resource.getpagesize()
        except (OSError, ValueError, IndexError):
            continue
    return total / (1 << 20)


# ================================================================================================
# Running a job
# ================================================================================================
GRACE_S = 3.0  # after a step's own time limit, before the watchdog kills the sandbox


def _overstayed(progress: Path) -> bool:
    """True when the step the sandbox last started (a cell or an exercise) is past its limit.

    The runtime's own alarm normally stops a slow step; this catches code that swallows the alarm
    (``except BaseException``) or blocks signals, without waiting for the whole run's wall limit.
    """
    try:
        with open(progress, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            last = f.read().decode(errors="replace").strip().splitlines()[-1]
        event = json.loads(last)
        return "limit" in event and time.time() - float(event["t"]) > float(event["limit"]) + GRACE_S
    except (OSError, ValueError, IndexError, KeyError, TypeError):
        return False


def run_job(job: dict, input_arrays: dict, config: SandboxConfig, extra_files: tuple[str, ...] = ()) -> SandboxResult:
    """Write ``job`` and its arrays, start the runtime in the sandbox, wait (with limits), return."""
    mode, _why = resolve_isolation(config.isolation, config.device)
    root = Path(tempfile.mkdtemp(prefix="ptgrade-", dir=config.base_dir))
    os.chmod(root, 0o755)
    job_dir, out_dir, site_dir = root / "job", root / "out", root / "site"
    for d in (job_dir, out_dir, site_dir):
        d.mkdir()
    allowed = build_site(site_dir, extra_files)
    with UidLease() as uid:
        return _run_leased(job, input_arrays, config, mode, root, job_dir, out_dir, site_dir, allowed, uid)


def _run_leased(job, input_arrays, config, mode, root, job_dir, out_dir, site_dir, allowed, uid) -> SandboxResult:
    import numpy as np

    inside = mode == "bwrap"
    job = dict(job, format=1, input_arrays=sorted(input_arrays),
               sys_path=["/sandbox/site" if inside else str(site_dir)] + site_packages_dirs(),
               blocked_modules=["ptinternals"], allowed_modules=allowed, device=config.device)
    (job_dir / "job.json").write_text(json.dumps(job))
    for name, arr in input_arrays.items():
        np.save(job_dir / f"{name}.npy", arr, allow_pickle=False)
    for p in [job_dir, site_dir, *job_dir.rglob("*"), *site_dir.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    if uid is not None:
        os.chown(out_dir, uid, uid)
    os.chmod(out_dir, 0o700)

    runtime = ("/sandbox/site" if inside else str(site_dir)) + "/ptinternals/grading/_runtime.py"
    j, o = ("/sandbox/job", "/sandbox/out") if inside else (str(job_dir), str(out_dir))
    cmd = [sys.executable, "-I", "-S", runtime, j, o]
    if inside:
        cmd = _bwrap_prefix(job_dir, out_dir, site_dir, config.device) + cmd
    home = "/sandbox/out" if inside else str(out_dir)
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "USER": "student", "LANG": "C.UTF-8",
           "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg", "MPLCONFIGDIR": home,
           "OMP_NUM_THREADS": str(config.limits.threads), "MKL_NUM_THREADS": str(config.limits.threads),
           "TRITON_CACHE_DIR": home + "/triton", "TORCHINDUCTOR_CACHE_DIR": home + "/inductor",
           "PTINTERNALS_DEVICE": config.device}
    if config.device == "cuda":
        for key in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "NVIDIA_VISIBLE_DEVICES"):
            if key in os.environ:
                env[key] = os.environ[key]
    else:
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""

    limits = config.limits
    t0 = time.monotonic()
    timed_out = memory_exceeded = False
    with open(root / "stdout.txt", "wb") as so, open(root / "stderr.txt", "wb") as se:
        proc = subprocess.Popen(cmd, stdout=so, stderr=se, stdin=subprocess.DEVNULL, env=env, cwd=str(out_dir),
                                preexec_fn=_preexec(limits, uid, config.device, isolate_net=not inside),
                                close_fds=True)
        try:
            while True:
                try:
                    proc.wait(timeout=0.05 if time.monotonic() - t0 < 1 else 0.25)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if time.monotonic() - t0 > limits.wall_s or _overstayed(out_dir / "progress.jsonl"):
                    timed_out = True
                    break
                if config.device == "cuda" and _group_rss_mb(proc.pid) > limits.memory_mb:
                    memory_exceeded = True
                    break
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the whole session: children, grandchildren, forks
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
            if uid is not None:
                _kill_uid(uid)
    rc = proc.returncode
    sig = -rc if rc is not None and rc < 0 else None
    if mode == "bwrap" and rc is not None and 128 < rc < 160:  # bwrap reports a child's signal as 128 + n
        sig = rc - 128
    if sig == signal.SIGKILL and not timed_out and not memory_exceeded and config.device != "cuda":
        memory_exceeded = _looks_like_oom(root)
    result = SandboxResult(rc, sig, timed_out, memory_exceeded, time.monotonic() - t0, mode, out_dir,
                           _tail(root / "stdout.txt"), _tail(root / "stderr.txt"))
    if "MemoryError" in result.stderr_tail and rc:
        result.memory_exceeded = True
    return result


def _pids_of_uid(uid: int) -> list[int]:
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.startswith("Uid:"):
                    if int(line.split()[1]) == uid:
                        pids.append(int(status.parent.name))
                    break
        except (OSError, ValueError):
            continue
    return pids


def _kill_uid(uid: int, timeout_s: float = 5.0) -> None:
    """Kill every process of the sandbox's dedicated uid (forks that left the session included)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = _pids_of_uid(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)


def _looks_like_oom(root: Path) -> bool:
    return "MemoryError" in _tail(root / "stderr.txt")


def _tail(path: Path, n: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def cleanup(result: SandboxResult) -> None:
    shutil.rmtree(result.out_dir.parent, ignore_errors=True)
