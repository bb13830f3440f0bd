"""Starting the grading sandbox: a fresh process, with limits, that sees only what it must.

Student code runs in a new process (``_runtime.py``) started from here with:

* **limits**: wall time (the process is killed), CPU time (``RLIMIT_CPU``), memory (``RLIMIT_AS`` per
  process, on top of the address space ``import torch`` maps in a torch job; with a root grader also a cgroup, which counts tmpfs and shared memory too; on a GPU,
  where CUDA reserves huge virtual ranges, a resident-memory watchdog instead of ``RLIMIT_AS``),
  process count (cgroup ``pids.max`` and ``RLIMIT_NPROC`` per dedicated uid), file size
  (``RLIMIT_FSIZE``), disk (a size-limited scratch folder, ``/tmp`` and ``/dev/shm``);
* **isolation** (``isolation.py``), the strongest available:

  ``bwrap``    bubblewrap: no network, read-only system, only the interpreter, the job and a scratch
               folder mounted; the course repository (solutions, gradebook) does not exist inside,
               nor do the packages an exercise forbids (torch, numpy). Run as root, the grader also
               drops to a dedicated uid per sandbox.
  ``process``  a plain subprocess with the same limits, a scrubbed environment and ``-I -S``, and no
               network when run as root (``unshare --net``). Weaker: code can read files the sandbox's
               user can read, and forbidden packages are only refused by an import hook. ``ptgrade``
               records grades this way only with ``--allow-weak-isolation``.

* **no reference implementation**: the sandbox's ``ptinternals`` is a copy of the allowed helper
  modules only (``ALLOWED_FILES``); importing a chapter's reference raises ImportError;
* **nothing trusted from the sandbox's files**: the watchdog's limits come from the job the grader
  wrote (each step's own limit, counted from when the grader first saw the step start), never from
  what the sandbox writes, and result files are sealed (HMAC) with a key the harness got on stdin
  (``outfiles.py`` reads them, ``trusted.py`` checks the seal).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import outfiles
from .isolation import (  # noqa: F401  (re-exported: the sandbox's public names)
    ALLOWED_FILES,
    UID_BASE,
    UID_COUNT,
    UID_LOCK_DIR,
    UidLease,
    absent_paths,
    build_site,
    bwrap_args,
    bwrap_works,
    kill_uid,
    mount_scratch,
    preexec,
    resolve_isolation,
    site_packages_dirs,
    torch_address_space_mb,
    unmount,
)
from .resources import cgroup_for, remove_files_of_uid


@dataclass
class Limits:
    wall_s: float = 120.0  # one sandbox run (set per run by the trusted grader from the job)
    cpu_s: int = 240
    memory_mb: int = 4096  # per process (RLIMIT_AS, beyond what import torch maps), the whole sandbox with a cgroup
    nproc: int = 64  # processes and threads of the sandbox
    fsize_mb: int = 64  # one file
    disk_mb: int = 512  # everything written to the scratch (output) folder
    tmp_mb: int = 256  # /tmp and /dev/shm inside bubblewrap, each
    threads: int = 1  # OMP/MKL threads inside the sandbox (workers run in parallel)
    total_s: float | None = None  # one submission, all its sandbox runs (None: derived from the exercises)


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
    disk_exceeded: bool = False
    key: bytes = b""  # the secret every result file of this run is sealed with (HMAC)
    overstayed: str | None = None  # the step (cell or exercise id) the watchdog stopped
    plain: bool = False  # no torch, no numpy in this run: results are plain JSON
    root: Path | None = None
    scratch_mounted: bool = False

    @property
    def crashed(self) -> bool:
        return self.timed_out or self.memory_exceeded or self.disk_exceeded or self.returncode != 0

    def describe(self) -> str:
        if self.timed_out:
            return f"ran past its time limit ({self.wall_s:.0f} s into the run) and was stopped"
        if self.memory_exceeded:
            return "used more memory than the limit and was stopped"
        if self.disk_exceeded:
            return "wrote more to disk than the limit and was stopped"
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


GRACE_S = 3.0  # after a step's own limit, before the watchdog kills the sandbox
STARTUP_S = 45.0  # interpreter, imports and reading the job, before the first step
DONE_GRACE_S = 5.0  # after the harness says it is done, before the process is killed anyway


# ================================================================================================
# The watchdog: limits from the job, never from the sandbox's files
# ================================================================================================
class Watchdog:
    """Decides when to stop a run, from what the grader knows about the job.

    ``steps`` maps every step of the job (cell and exercise ids) to its limit. The progress file only
    says which step the sandbox *claims* to be in; the clock of a step starts when the grader first
    sees it, is never reset, and a step it does not know is ignored. So a submission that keeps
    writing progress lines cannot run longer than the sum of its steps' limits, and lines naming
    unknown steps change nothing.
    """

    def __init__(self, steps: dict[str, float], wall_s: float):
        self.steps, self.wall_s = steps, wall_s
        self.first_seen: dict[str, float] = {}
        self.current: str | None = None
        self.done_at: float | None = None

    def read(self, dir_fd: int, now: float) -> None:
        for line in reversed(outfiles.tail_lines(dir_fd, "progress.jsonl", cap=4096, max_lines=20)):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            if event.get("done") is True:
                self.done_at = self.done_at or now
                return
            step = event.get("cell", event.get("exercise"))
            if isinstance(step, str) and step in self.steps:
                self.current = step
                self.first_seen.setdefault(step, now)
                return

    def overstayed(self, now: float) -> str | None:
        if self.done_at is not None:
            return "done" if now - self.done_at > DONE_GRACE_S else None
        if self.current is not None and now - self.first_seen[self.current] > self.steps[self.current] + GRACE_S:
            return self.current
        return None


def _job_steps(job: dict) -> dict[str, float]:
    steps = {c["id"]: float(job.get("cell_timeout_s", 30)) for c in job["cells"] if c["id"] not in job.get("skip_cells", [])}
    steps.update({e["id"]: float(e.get("timeout_s", 20)) for e in job["exercises"]})
    return steps


def run_budget(job: dict) -> float:
    """The longest one run of ``job`` may take: start-up plus every step's limit (and its grace)."""
    return STARTUP_S + sum(limit + GRACE_S for limit in _job_steps(job).values())


# ================================================================================================
# Running a job
# ================================================================================================
def run_job(job: dict, input_arrays: dict, config: SandboxConfig, extra_files: tuple[str, ...] = (),
            absent: tuple[str, ...] = ()) -> SandboxResult:
    """Write ``job`` and its arrays, start the runtime in the sandbox, wait (with limits), return.

    ``absent``: packages that must not exist in this run (an exercise forbids them); the job is then
    plain JSON and the harness imports neither torch nor numpy.
    """
    mode, _why = resolve_isolation(config.isolation, config.device)
    plain = bool(set(absent) & {"torch", "numpy"})
    if plain and input_arrays:
        raise ValueError("a job without torch and numpy cannot carry arrays: encode its cases as plain values")
    with UidLease() as uid:
        base = config.base_dir or tempfile.gettempdir()
        root = Path(tempfile.mkdtemp(prefix=f"ptgrade-u{uid}-" if uid is not None else "ptgrade-", dir=base))
        job_dir, out_dir, site_dir = root / "job", root / "out", root / "site"
        for d in (job_dir, out_dir, site_dir):
            d.mkdir()
        allowed = build_site(site_dir, extra_files)
        scratch_mounted = False
        try:
            if uid is not None:
                scratch_mounted = mount_scratch(out_dir, config.limits.disk_mb, uid)
            result = _run_leased(job, input_arrays, config, mode, root, job_dir, out_dir, site_dir, allowed, uid,
                                 absent, plain, scratch_mounted)
        except BaseException:
            if scratch_mounted:
                unmount(out_dir)
            shutil.rmtree(root, ignore_errors=True)
            raise
        result.root, result.scratch_mounted = root, scratch_mounted
        return result


def _private(root: Path, job_dir: Path, site_dir: Path, out_dir: Path, uid: int | None) -> None:
    """Only this sandbox's uid may read its job (a concurrent sandbox's uid may not), and only the
    grader may write it; the output folder belongs to the sandbox's uid."""
    os.chmod(root, 0o711)  # others may pass through, not list (the folder names are random too)
    gid = uid if uid is not None else os.getgid()
    for p in [job_dir, site_dir, *job_dir.rglob("*"), *site_dir.rglob("*")]:
        if uid is not None:
            os.chown(p, 0, gid, follow_symlinks=False)
        os.chmod(p, 0o750 if p.is_dir() else 0o640)
    if uid is not None:
        os.chown(out_dir, uid, uid)
    os.chmod(out_dir, 0o700)


def _run_leased(job, input_arrays, config, mode, root, job_dir, out_dir, site_dir, allowed, uid, absent, plain,
                scratch_mounted) -> SandboxResult:
    inside = mode == "bwrap"
    key = secrets.token_bytes(32)
    job = dict(job, format=1, input_arrays=sorted(input_arrays), plain=plain, key_on_stdin=True,
               forbid=list(absent), forbid_absent=inside,
               sys_path=["/sandbox/site" if inside else str(site_dir)] + site_packages_dirs(),
               blocked_modules=["ptinternals"], allowed_modules=allowed, device=config.device)
    (job_dir / "job.json").write_text(json.dumps(job))
    if input_arrays:
        import numpy as np

        for name, arr in input_arrays.items():
            np.save(job_dir / f"{name}.npy", arr, allow_pickle=False)
    _private(root, job_dir, site_dir, out_dir, uid)

    runtime = ("/sandbox/site" if inside else str(site_dir)) + "/ptinternals/grading/_runtime.py"
    j, o = ("/sandbox/job", "/sandbox/out") if inside else (str(job_dir), str(out_dir))
    cmd = [sys.executable, "-I", "-S", runtime, j, o]
    limits = config.limits
    if inside:
        hide = absent_paths(tuple(sorted(absent))) if absent else ()
        cmd = bwrap_args(job_dir, out_dir, site_dir, config.device, hide=hide, tmp_mb=limits.tmp_mb) + cmd
    home = "/sandbox/out" if inside else str(out_dir)
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "USER": "student", "LANG": "C.UTF-8",
           "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg", "MPLCONFIGDIR": home,
           "OMP_NUM_THREADS": str(limits.threads), "MKL_NUM_THREADS": str(limits.threads),
           "TRITON_CACHE_DIR": home + "/triton", "TORCHINDUCTOR_CACHE_DIR": home + "/inductor",
           # Inductor's precompiled header (120-160 MB) would exceed RLIMIT_FSIZE: build kernels without it
           "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0",
           "PTINTERNALS_DEVICE": config.device}
    if config.device == "cuda":
        for key in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "NVIDIA_VISIBLE_DEVICES"):
            if key in os.environ:
                env[key] = os.environ[key]
    else:
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""

    watchdog = Watchdog(_job_steps(job), limits.wall_s)
    t0 = time.monotonic()
    timed_out = memory_exceeded = disk_exceeded = False
    overstayed = None
    out_fd = outfiles.open_dir(out_dir)
    cgroup = cgroup_for(limits.memory_mb, limits.nproc)
    # RLIMIT_AS: memory_mb on top of what importing torch maps (3.1 GiB for the CUDA build), never the cgroup's
    torch_mappings = 0 if plain or config.device == "cuda" else torch_address_space_mb()
    try:
        with cgroup, open(root / "stdout.txt", "wb") as so, open(root / "stderr.txt", "wb") as se:
            proc = subprocess.Popen(cmd, stdout=so, stderr=se, stdin=subprocess.PIPE, env=env, cwd=str(out_dir),
                                    preexec_fn=preexec(limits, uid, config.device, isolate_net=not inside,
                                                       join=cgroup.join_fn(), extra_address_space_mb=torch_mappings),
                                    close_fds=True)
            try:
                try:
                    proc.stdin.write(key.hex().encode() + b"\n")
                    proc.stdin.close()
                except OSError:  # the process died at once: its status says why
                    pass
                tick = 0
                while True:
                    try:
                        proc.wait(timeout=0.05 if time.monotonic() - t0 < 1 else 0.25)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    now = time.monotonic()
                    tick += 1
                    watchdog.read(out_fd, now)
                    step = watchdog.overstayed(now)
                    if now - t0 > limits.wall_s or (step is not None and step != "done"):
                        timed_out, overstayed = True, step
                        break
                    if step == "done":  # results written; whatever still runs is not the harness
                        break
                    if not scratch_mounted and tick % 2 == 0 and \
                            outfiles.folder_bytes(out_dir, stop_above=limits.disk_mb << 20) > limits.disk_mb << 20:
                        disk_exceeded = True
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
                cgroup.kill_all()
                if uid is not None:
                    kill_uid(uid)
            oom_killed = cgroup.oom_killed()
    finally:
        os.close(out_fd)
    if uid is not None and not inside:
        remove_files_of_uid(uid)  # what the sandbox left in /tmp, /var/tmp, /dev/shm (bwrap: its own tmpfs)
    rc = proc.returncode
    sig = -rc if rc is not None and rc < 0 else None
    if inside and rc is not None and 128 < rc < 160:  # bwrap reports a child's signal as 128 + n
        sig = rc - 128
    if watchdog.done_at is not None and not timed_out:
        rc, sig = 0, None  # the harness finished: a kill after that is the clean-up, not a crash
    if sig == signal.SIGKILL and not timed_out and not disk_exceeded and (oom_killed or config.device != "cuda"):
        memory_exceeded = oom_killed or _looks_like_oom(root)
    result = SandboxResult(rc, sig, timed_out, memory_exceeded, time.monotonic() - t0, mode, out_dir,
                           _tail(root / "stdout.txt"), _tail(root / "stderr.txt"), disk_exceeded, key,
                           overstayed, plain)
    if "MemoryError" in result.stderr_tail and rc:
        result.memory_exceeded = True
    return result


def _group_rss_mb(pgid: int) -> float:
    """Resident memory of every process in the sandbox's session (Linux /proc)."""
    import resource

    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == pgid:  # field 5 (pgrp) counted after the ")"
                total += int(fields[21]) * resource.getpagesize()
        except (OSError, ValueError, IndexError):
            continue
    return total / (1 << 20)


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
    """Remove everything of a run: its scratch mount and its folders."""
    root = result.root or result.out_dir.parent
    if result.scratch_mounted:
        unmount(result.out_dir)
    shutil.rmtree(root, ignore_errors=True)
