"""The chapter's benchmark suite runs on the CPU and writes results that match bench/run.py's schema;
on a GPU, the measured overlap of copies and compute follows the closed form."""
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _load(name):
    module_name = f"_ptbench_{name}"
    spec = importlib.util.spec_from_file_location(module_name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module   # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_bench_runs_on_cpu_and_matches_the_schema(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        bench_run = _load("run")
        measurements = _load("bench_profiling").run(SimpleNamespace(device="cpu", small=True, out_dir=tmp_path))
    finally:
        sys.path.remove(str(ROOT / "bench"))
    results = {"schema": 1, "date": "x", "device": {}, "versions": {}, "peaks": {}, "small": True, "suites": {},
               "measurements": [m.to_dict() for m in measurements]}
    assert bench_run.validate(results) == []
    by_name = {m.name: m for m in measurements}
    assert by_name["sync_detector"].extra["disagree"] == []
    assert by_name["trace_vs_key_averages"].extra["n_problems"] == 0


@pytest.mark.gpu
def test_measured_overlap_follows_the_closed_form():
    from ptinternals.profiling.cuda_overlap import measure_overlap

    r = measure_overlap(batch_bytes=128 << 20, compute_ms=3.0, steps=10)
    for loop in ("blocking", "async", "prefetch"):
        assert r[f"{loop}_ms"] == pytest.approx(r[f"{loop}_predicted_ms"], rel=0.35), (loop, r)
    assert r["prefetch_ms"] < 0.9 * r["async_ms"]
    assert torch.cuda.is_available()
