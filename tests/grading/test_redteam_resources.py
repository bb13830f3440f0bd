"""Red team, resources and isolation: what a submission writes is bounded where the kernel counts it and gone
after grading; job folders are private; process isolation is not a silent fallback for grades of record."""
import glob
import os
import time

import pytest

from ptinternals.grading.cli import main as ptgrade
from ptinternals.grading.isolation import UID_BASE, UID_COUNT
from ptinternals.grading.resources import cgroup_support
from ptinternals.grading.sandbox import Limits, _private

from .redteam import assert_victim_graded, body, grade, needs_bwrap, needs_root, scored_zero

PLAIN = ("strides.contiguous_strides", "strides.storage_index")


def filler(where: str, mb: int) -> str:
    return body(f"""
        import os
        def contiguous_strides(shape):
            with open(os.path.join({where!r}, "fill.bin"), "wb") as f:
                for _ in range({mb}):
                    f.write(b"x" * (1 << 20))
            return (1,) * len(shape)
        """)


@needs_bwrap
@pytest.mark.parametrize("where", ["/tmp", "/dev/shm", "."])  # "." is the scratch (output) folder
def test_filling_a_writable_folder_stops_at_its_size(where, tmp_path):
    shm_before = os.statvfs("/dev/shm")
    results, report, seconds = grade("strides", {"contiguous_strides_code": filler(where, 3000)}, PLAIN, tmp_path)
    scored_zero(results["strides.contiguous_strides"])  # 3 GB does not fit: an error (or the run is stopped)
    assert results["strides.storage_index"].passed
    assert seconds < 60
    free_after = os.statvfs("/dev/shm").f_bfree * os.statvfs("/dev/shm").f_frsize
    assert free_after >= shm_before.f_bfree * shm_before.f_frsize - (64 << 20), "host shared memory was used"
    assert_victim_graded("strides", PLAIN, tmp_path)


@needs_bwrap
@needs_root
@pytest.mark.skipif(cgroup_support()[0] is None, reason="no cgroup memory controller on this machine")
def test_memory_counts_tmpfs_and_shared_memory(tmp_path):
    code = body("""
        def contiguous_strides(shape):
            for where in ("/tmp", "/dev/shm"):
                for part in range(11):  # 352 MiB in files under the per-file limit (RLIMIT_FSIZE, 64 MiB)
                    with open(where + f"/fill{part}.bin", "wb") as f:
                        for _ in range(32):
                            f.write(b"x" * (1 << 20))
            hog = bytearray(200 << 20)
            return (1,) * len(shape)
        """)
    results, report, _ = grade("strides", {"contiguous_strides_code": code}, PLAIN, tmp_path,
                               limits=Limits(memory_mb=700, tmp_mb=400))
    # killed for memory, or slowed to its time limit by the cgroup's reclaim: never finished, never past the limit
    scored_zero(results["strides.contiguous_strides"], "memory", "crashed", "timeout")
    assert results["strides.storage_index"].passed
    assert_victim_graded("strides", PLAIN, tmp_path)


@needs_root
def test_process_isolation_leaves_nothing_behind(tmp_path):
    tag = f"ptgrade-redteam-{os.getpid()}"
    code = body(f"""
        import os, time
        for folder in ("/tmp", "/var/tmp", "/dev/shm"):
            try:
                os.makedirs(folder + "/{tag}-dir", exist_ok=True)
                open(folder + "/{tag}-file", "w").write("left behind")
            except OSError:
                pass
        if os.fork() == 0:                     # a daemon that escapes the session
            os.setsid()
            if os.fork() == 0:
                time.sleep(3600)
            os._exit(0)
        def contiguous_strides(shape):
            return (1,) * len(shape)
        """)
    results, report, _ = grade("strides", {"contiguous_strides_code": code}, PLAIN, tmp_path, isolation="process")
    assert report.isolation == "process"
    leftovers = [p for folder in ("/tmp", "/var/tmp", "/dev/shm") for p in glob.glob(f"{folder}/{tag}-*")]
    assert not leftovers, leftovers
    time.sleep(0.2)
    alive = [pid for pid in os.listdir("/proc") if pid.isdigit() and _sandbox_uid(pid)]
    assert not alive, f"processes of sandbox uids survived: {alive}"


def _sandbox_uid(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    state = next((line.split()[1] for line in lines if line.startswith("State:")), "Z")
    uid = next((int(line.split()[1]) for line in lines if line.startswith("Uid:")), -1)
    return state not in ("Z", "X") and UID_BASE <= uid < UID_BASE + UID_COUNT - 16 and _lease_free(uid)


def _lease_free(uid: int) -> bool:
    import fcntl

    from ptinternals.grading.isolation import UID_LOCK_DIR

    with open(UID_LOCK_DIR / f"{uid}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # another grader uses that uid right now
        fcntl.flock(lock, fcntl.LOCK_UN)
        return True


@needs_root
def test_another_workers_job_folder_is_private(tmp_path):
    """Process isolation, two workers: a student's code cannot read the job (the answers) of a concurrent one."""
    other = tmp_path / "ptgrade-u61990-other"
    for d in ("job", "site", "out"):
        (other / d).mkdir(parents=True)
    (other / "job" / "job.json").write_text('{"cells": "SECRET ANSWERS OF ANOTHER STUDENT"}')
    _private(other, other / "job", other / "site", other / "out", UID_BASE + 990)
    code = body(f"""
        import glob
        def contiguous_strides(shape):
            for path in glob.glob({str(tmp_path)!r} + "/ptgrade-*/job/job.json") + glob.glob("/tmp/ptgrade-*/job/job.json"):
                try:
                    text = open(path).read()      # its own job is readable, of course
                except PermissionError:
                    continue
                if "SEC" + "RET" in text:            # (spelled so that its own job does not match)
                    raise RuntimeError("READ " + text)
            s, r = [], 1
            for n in reversed(shape):
                s.append(r); r *= max(n, 1)
            return tuple(reversed(s))
        """)
    results, report, _ = grade("strides", {"contiguous_strides_code": code}, PLAIN, tmp_path, isolation="process")
    assert "SECRET" not in results["strides.contiguous_strides"].message
    assert results["strides.contiguous_strides"].passed, results["strides.contiguous_strides"].message


def test_grades_of_record_refuse_process_isolation(course, capsys):
    from .conftest import add_submission, submission

    add_submission(course, "ada", submission())
    assert ptgrade(["autograde", "strides", "--isolation", "process", "--quiet"]) == 3
    err = capsys.readouterr().err
    assert "--allow-weak-isolation" in err and "process isolation" in err
    assert not (course / "autograder" / "reports" / "ada").exists()  # nothing was graded


def test_a_torch_jobs_address_space_limit_is_on_top_of_torchs_own_mappings():
    """RLIMIT_AS counts mappings: PyPI's CUDA build of torch maps about 3 GiB at import, with no GPU in sight.
    The grader measures that once (a fresh interpreter, as the harness starts) and adds it to a torch job's
    limit, so memory_mb is the submission's on every build; a 1.5 GiB limit once killed every torch job of
    torch 2.11+cu130 at `import torch` (tests/grading/test_redteam_output.py grades such jobs)."""
    import subprocess
    import sys

    from ptinternals.grading.isolation import torch_address_space_mb

    mapped = torch_address_space_mb()
    code = "import numpy, torch; print(torch.ones(4).sum().item())"
    limited = subprocess.run([sys.executable, "-c", f"import resource; m = {mapped} << 20; "
                              f"resource.setrlimit(resource.RLIMIT_AS, (m + (256 << 20),) * 2); exec({code!r})"],
                             capture_output=True, text=True, timeout=120, env={"CUDA_VISIBLE_DEVICES": ""})
    assert 100 < mapped < 16384, mapped
    assert limited.stdout.strip() == "4.0", limited.stderr[-500:]
