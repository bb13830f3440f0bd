"""The GPU check script, validated on the CPU (the dry run CI can do): arguments, wheel list, steps,
result files and their schema, so the first real GPU run does not die on a typo."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "autograder" / "gpu_check.sh"
sys.path.insert(0, str(ROOT / "bench"))

import gpu_report  # noqa: E402
import run as bench_run  # noqa: E402


def test_help_and_bad_arguments():
    assert subprocess.run([SCRIPT, "--help"], capture_output=True, text=True).returncode == 0
    bad = subprocess.run([SCRIPT, "--frobnicate"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown argument --frobnicate" in bad.stderr
    bad = subprocess.run([SCRIPT, "--budget-scale", "fast"], capture_output=True, text=True)
    assert bad.returncode == 2 and "must be a number" in bad.stderr
    bad = subprocess.run([SCRIPT, "--dry-run", "--venv", "/nonexistent-venv", "--out", "/tmp"], capture_output=True,
                         text=True)
    assert bad.returncode == 3 and "needs /nonexistent-venv" in bad.stderr


@pytest.mark.slow
def test_dry_run_produces_valid_results(tmp_path):
    # in the venv that runs this suite: .venv (torch 2.13) in `make test`, .venv-compat (2.11) in `make compat`
    proc = subprocess.run([SCRIPT, "--dry-run", "--venv", sys.prefix, "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "wheel list: consistent with constraints.txt and constraints-gpu.txt" in proc.stdout
    import torch

    pins = "constraints-gpu.txt" if torch.__version__.startswith("2.11.") else "constraints.txt"
    assert f"environment: torch {torch.__version__.split('+')[0]}" in proc.stdout and f"(the pins of {pins})" in proc.stdout
    [report_file] = tmp_path.glob("gpu-check-*-dryrun.json")
    report = json.loads(report_file.read_text())
    assert gpu_report.validate(report) == []
    assert all(s["status"] == "ok" for s in report["steps"].values())
    assert report["autograde"]["strides"]["failed"] == []
    assert report["tests"]["collected"] > 0  # the GPU-marked tests exist and import on CPU
    # the table is printed last
    assert proc.stdout.strip().splitlines()[-1].startswith("bench ")


def test_bench_schema_rejects_meaningless_numbers():
    results = {"schema": 1, "date": "x", "device": {}, "versions": {}, "peaks": {}, "small": True, "suites": {},
               "measurements": [{"suite": "s", "name": "n", "device": "cpu", "shape": "1", "dtype": "f", "ms": 1.0}]}
    assert any("without meaning" in p for p in bench_run.validate(results))
    assert any("missing key" in p for p in bench_run.validate({}))
