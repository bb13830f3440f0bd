"""The cluster templates and what they rely on, without a cluster: the shard each scheduler task gets,
`ptgrade doctor` on a cluster node, the Kubernetes Job against the Kubernetes schema, and the templates'
shell logic run with a stand-in `ptgrade` that records how it was called.

The Slurm template also runs for real on a local Slurm (test_slurm.py); the Kubernetes Job is validated and
its command line exercised here, but never run on a cluster.
"""
import copy
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ptinternals.grading.classroom import shard
from ptinternals.grading.cli import build_parser
from ptinternals.grading.cli import main as ptgrade
from ptinternals.grading.scheduler import placement

from .conftest import add_submission, submission

REPO = Path(__file__).resolve().parents[2]
SBATCH = REPO / "autograder" / "slurm" / "grade-array.sbatch"
K8S_JOB = REPO / "autograder" / "k8s" / "grade-job.yaml"
STUDENTS = [f"s{i}" for i in range(7)]


def slurm_task(task: int, lo: int, hi: int, step: int = 1, count: int | None = None, **extra) -> dict:
    count = (hi - lo) // step + 1 if count is None else count
    return {"SLURM_JOB_ID": "99", "SLURM_ARRAY_JOB_ID": "41", "SLURM_ARRAY_TASK_ID": str(task),
            "SLURM_ARRAY_TASK_MIN": str(lo), "SLURM_ARRAY_TASK_MAX": str(hi), "SLURM_ARRAY_TASK_STEP": str(step),
            "SLURM_ARRAY_TASK_COUNT": str(count), **extra}


# ---- which shard a task grades --------------------------------------------------------------------------
@pytest.mark.parametrize("lo,hi,step", [(0, 2, 1), (1, 3, 1), (0, 4, 2), (5, 5, 1)])
def test_slurm_array_tasks_split_the_class_exactly(lo, hi, step):
    tasks = range(lo, hi + 1, step)
    parts = [shard(STUDENTS, placement(slurm_task(t, lo, hi, step)).shard) for t in tasks]
    assert sorted(sum(parts, [])) == STUDENTS  # every submission in exactly one task
    assert placement(slurm_task(lo, lo, hi, step)).shard == f"0/{len(tasks)}"
    assert placement(slurm_task(hi, lo, hi, step)).task == f"array job 41, task {hi} (tasks {lo}-{hi}" + (
        f":{step})" if step > 1 else ")")


def test_slurm_array_with_holes_needs_ptgrade_shards():
    holes = slurm_task(5, 0, 5, count=3)  # --array=0,2,5
    with pytest.raises(ValueError, match="not a range.*PTGRADE_SHARDS"):
        placement(holes)
    assert placement({**holes, "PTGRADE_SHARDS": "6"}).shard == "5/6"
    assert placement(slurm_task(1, 1, 1, PTGRADE_SHARDS="3")).shard == "1/3"  # resubmit shard 1 of 3 alone
    with pytest.raises(ValueError, match="PTGRADE_SHARDS=3 does not fit SLURM_ARRAY_TASK_ID 3"):
        placement(slurm_task(3, 3, 3, PTGRADE_SHARDS="3"))


def test_kubernetes_index_and_other_placements():
    assert placement({"JOB_COMPLETION_INDEX": "2", "PTGRADE_SHARDS": "4"}).shard == "2/4"
    with pytest.raises(ValueError, match="PTGRADE_SHARDS is not"):
        placement({"JOB_COMPLETION_INDEX": "2"})
    with pytest.raises(ValueError, match="JOB_COMPLETION_INDEX must be an integer, got 'x'"):
        placement({"JOB_COMPLETION_INDEX": "x", "PTGRADE_SHARDS": "4"})
    assert placement({"SLURM_JOB_ID": "7"}).shard is None  # a plain (not array) Slurm job grades everyone
    assert placement({}).scheduler == "none" and placement({}).shard is None
    assert shard(STUDENTS, "1/3") == ["s1", "s4"]  # explicit shards still work


def test_shard_auto_reads_the_environment(monkeypatch):
    for name in [k for k in os.environ if k.startswith("SLURM_") or k in ("JOB_COMPLETION_INDEX", "PTGRADE_SHARDS")]:
        monkeypatch.delenv(name)
    assert shard(STUDENTS, "auto") == STUDENTS
    for k, v in slurm_task(2, 0, 2).items():
        monkeypatch.setenv(k, v)
    assert shard(STUDENTS, "auto") == ["s2", "s5"]


# ---- ptgrade doctor on a cluster node --------------------------------------------------------------------
def test_doctor_reports_task_shard_gradebook_and_work(course, monkeypatch, capsys):
    for i in range(4):
        add_submission(course, f"s{i}", submission())
    for name in [k for k in os.environ if k.startswith("SLURM_") or k in ("JOB_COMPLETION_INDEX", "PTGRADE_DB_URL")]:
        monkeypatch.delenv(name)
    assert ptgrade(["doctor", "--assignment", "strides", "--isolation", "process"]) == 0
    out = capsys.readouterr().out
    assert "none: no scheduler" in out and "not created yet" in out
    assert "NOT in the gradebook" in out and "(autograde would register it)" in out  # fine for one grader
    assert "4 of strides; this shard 4, to grade 4: s0, s1, s2, s3" in out
    for k, v in slurm_task(1, 0, 1).items():
        monkeypatch.setenv(k, v)
    assert ptgrade(["doctor", "--assignment", "strides", "--isolation", "process"]) == 3  # tasks would race
    out = capsys.readouterr().out
    assert "slurm: array job 41, task 1 (tasks 0-1)" in out and "shard (--shard auto)  1/2" in out
    assert "release strides --db ...` once before submitting the array" in out
    assert "4 of strides; this shard 2, to grade 2: s1, s3" in out
    unreachable = "postgresql://grader:secret@/course?host=/nonexistent&port=5"
    assert ptgrade(["doctor", "--db", unreachable, "--isolation", "process"]) == 3
    out = capsys.readouterr().out
    assert "UNREACHABLE" in out and "/nonexistent" in out and "secret" not in out  # no password in logs
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "5")  # not a range any more
    assert ptgrade(["doctor", "--isolation", "process"]) == 3
    assert "UNUSABLE" in capsys.readouterr().out


# ---- the templates' shell, with a stand-in ptgrade ---------------------------------------------------------
def fake_course(tmp_path: Path, doctor_exit: int = 0) -> tuple[Path, Path]:
    """A folder with .venv/bin/{python,ptgrade}: the course's python, and a ptgrade that logs its arguments."""
    root, log = tmp_path / "course", tmp_path / "calls.jsonl"
    (root / ".venv" / "bin").mkdir(parents=True)
    # a wrapper, not a symlink: a symlinked interpreter finds no pyvenv.cfg beside it and starts as the
    # base Python, without the course's packages
    python = root / ".venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    fake = root / ".venv" / "bin" / "ptgrade"
    fake.write_text(f"#!/bin/sh\n{sys.executable} -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\" >> {log}\n"
                    f"[ \"$1\" = doctor ] && exit {doctor_exit}\nexit 0\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return root, log


def calls(log: Path) -> list[list[str]]:
    lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    for argv in lines:
        build_parser().parse_args(argv)  # each call is a valid ptgrade command line
    return lines


@pytest.mark.parametrize("cuda,device,gpus", [(None, "cpu", None), ("NoDevFiles", "cpu", None), ("2,3", "cuda", "2,3")])
def test_sbatch_uses_only_the_gpus_slurm_allocated(tmp_path, cuda, device, gpus):
    root, log = fake_course(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CUDA_", "PTGRADE_"))}
    env.update(ASSIGNMENT="strides", PTGRADE_DB_URL="postgresql://g@db/c", SLURM_SUBMIT_DIR=str(root),
               SLURM_CPUS_PER_TASK="3", **({"CUDA_VISIBLE_DEVICES": cuda} if cuda else {}))
    proc = subprocess.run(["bash", SBATCH], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    doctor, grade = calls(log)
    assert doctor[:3] == ["doctor", "--assignment", "strides"] and doctor[doctor.index("--device") + 1] == device
    args = build_parser().parse_args(grade)
    assert (args.shard, args.device, args.gpus, args.workers, args.quiet) == ("auto", device, gpus, 3, True)
    assert "--gres" not in "".join(line for line in SBATCH.read_text().splitlines() if line.startswith("#SBATCH"))


def test_sbatch_stops_when_doctor_says_it_cannot_grade(tmp_path):
    root, log = fake_course(tmp_path, doctor_exit=3)
    env = dict(os.environ, ASSIGNMENT="strides", PTGRADE_DB_URL="postgresql://g@db/c", SLURM_SUBMIT_DIR=str(root))
    proc = subprocess.run(["bash", SBATCH], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 3 and "cannot grade" in proc.stderr
    assert [c[0] for c in calls(log)] == ["doctor"]  # no grading started


def k8s_job() -> dict:
    return yaml.safe_load(K8S_JOB.read_text())


def run_pod(tmp_path: Path, job: dict, index: int, doctor_exit: int = 0, **overrides) -> tuple[int, list]:
    """Run the Job's container command as its pod would (sh -c, the Job's env, JOB_COMPLETION_INDEX)."""
    root, log = fake_course(tmp_path / f"pod{index}", doctor_exit)
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value", "postgresql://g@db/c") for e in container["env"]}
    env.update(PATH=os.environ["PATH"], JOB_COMPLETION_INDEX=str(index), **overrides)
    proc = subprocess.run([*container["command"], *container["args"]], env=env, cwd=root, capture_output=True, text=True)
    return proc.returncode, calls(log)


def test_k8s_job_command_line_runs_as_a_pod_would(tmp_path):
    job = k8s_job()
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert int(env["PTGRADE_SHARDS"]) == job["spec"]["completions"] >= job["spec"]["parallelism"]
    assert job["spec"]["completionMode"] == "Indexed" and "strides" in job["metadata"]["name"]
    status, (doctor, grade) = run_pod(tmp_path, job, 3)
    args = build_parser().parse_args(grade)
    assert status == 0 and doctor[0] == "doctor"
    assert (args.assignment, args.shard, args.device, args.gpus, args.workers) == ("strides", "auto", "cuda", "0", 2)
    status, (_, grade) = run_pod(tmp_path, job, 1, PTGRADE_DEVICE="cpu")  # the Job edited for CPU nodes
    assert status == 0 and build_parser().parse_args(grade).gpus is None
    status, made = run_pod(tmp_path, job, 2, doctor_exit=3)
    assert status == 3 and [c[0] for c in made] == ["doctor"]


# ---- the Kubernetes Job against the Kubernetes schema ------------------------------------------------------
@pytest.mark.parametrize("version", ["1.29.0", "1.33.0", "1.37.0"])
def test_k8s_job_is_valid_kubernetes(version):
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is a dev dependency (pyproject.toml)")
    kv.validate(k8s_job(), version, strict=True)  # strict: unknown fields are errors too


@pytest.mark.parametrize("edit", ["typo", "type", "missing"])
def test_the_validator_rejects_broken_jobs(edit):
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is a dev dependency (pyproject.toml)")
    job = copy.deepcopy(k8s_job())
    if edit == "typo":
        job["spec"]["completionsMode"] = job["spec"].pop("completionMode")
    elif edit == "type":
        job["spec"]["completions"] = "four"
    else:
        del job["spec"]["template"]["spec"]["containers"][0]["name"]
    with pytest.raises(kv.ValidationError):
        kv.validate(job, "1.37.0", strict=True)
