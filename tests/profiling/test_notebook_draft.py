"""The chapter's notebook source runs on the CPU, and its solutions are right.

Until the chapter's checkers exist, ``check(...)`` is replaced here by a stand-in that judges each
solution against the reference on a few cases (the real checkers will use many more, hypothesis-drawn).
"""
import os
import re
import tempfile
from pathlib import Path

import pytest
import torch

from ptinternals.profiling import SimulatedDevice, SyncDetector
from ptinternals.profiling.overlap import LOOPS, StepCosts, predict_step_us, simulate_training
from ptinternals.profiling.profile_step import capstone_parts
from ptinternals.profiling.sync_programs import SETUP, STATEMENTS, SyncProgram, make_program
from ptinternals.profiling.timing import event_time_ms
from ptinternals.profiling.trace_analysis import gpu_idle_gaps, gpu_utilization, load_trace, op_stats, top_kernels
from ptinternals.profiling.training_loops import make_batches, make_model, train_with_hidden_syncs

SOURCE = Path(__file__).resolve().parents[2] / "solutions" / "profiling.py"
MARKER = re.compile(r"^# %%(?:\s*\[(?P<kind>[^\]]+)\])?\s*$")
EXERCISES = ("sync_reason", "time_gpu", "predict_step", "train_prefetch", "op_times", "gpu_activity",
             "train_fast", "capstone_costs")


def _cells():
    cells = []
    for line in SOURCE.read_text().splitlines():
        m = MARKER.match(line)
        if m:
            cells.append(((m.group("kind") or "code").strip(), []))
        elif cells:
            cells[-1][1].append(line)
    return [(kind, "\n".join(lines)) for kind, lines in cells]


# ---- stand-in judges, one per exercise -----------------------------------------------------------------
def _sync_reason(entry):
    programs = [SyncProgram("<one>", "\n".join(SETUP + (s.code,)) + "\n", tuple((len(SETUP) + 1, r) for r in s.reasons))
                for s in STATEMENTS] + [make_program(seed, 10) for seed in range(3)]
    for p in programs:
        with SyncDetector(rule=entry) as det:
            p.run("cuda")
        got = [(int(e.where.rsplit(":", 1)[1]), e.reason) for e in det.implicit() if e.where.startswith(p.name)]
        assert got == list(p.expected), (p.source, got, p.expected)


def _time_gpu(entry):
    for seed, (overhead, kernel) in enumerate([(3, 40), (5, 250), (20, 4)]):
        dev, ref_dev = (SimulatedDevice(launch_overhead_us=overhead, first_call_us=1000, device_jitter=(0.2, 300),
                                        seed=seed) for _ in range(2))
        median, iqr = entry(lambda d=dev, k=kernel: d.launch("k", k), dev, warmup=2, reps=9)
        ref = event_time_ms(lambda d=ref_dev, k=kernel: d.launch("k", k), ref_dev, warmup=2, reps=9)
        assert (median, iqr) == pytest.approx((ref.median, ref.iqr)), (overhead, kernel)


def _predict_step(entry):
    for nb in (0, 500_000, 1_500_000):
        for c, h in ((0, 0), (10, 3), (30, 30), (5, 40)):
            for loop in LOOPS:
                for pinned in (True, False):
                    for item in (True, False):
                        d = SimulatedDevice(launch_overhead_us=0)
                        tl = simulate_training(StepCosts(nb, c, h), 7, loop, pinned=pinned, item=item, device=d)
                        got = entry(d.copy_us(nb, True), d.copy_us(nb, False), c, h, loop, pinned=pinned, item=item)
                        assert got == pytest.approx(tl.steady_step_us), (nb, c, h, loop, pinned, item)


def _train_prefetch(entry):
    for nb, c, h in ((1_000_000, 30, 5), (1_000_000, 5, 2), (200_000, 10, 12)):
        d = SimulatedDevice(launch_overhead_us=0)
        entry(d, [nb] * 6, c, h)
        recs = {r.name: r for r in d.records}
        assert d.races == [] and not any(r.kind == "wait" for r in d.records)
        assert all(recs[f"step{i}"].start >= recs[f"batch{i}"].end for i in range(6))
        ends = [recs[f"step{i}"].end for i in range(6)]
        assert ends[3] - ends[2] == pytest.approx(predict_step_us(d.copy_us(nb, True), 0, c, h, "prefetch"))
    entry(SimulatedDevice(), [], 1, 1)          # no batches: nothing to do


def _op_times(entry):
    from torch.profiler import ProfilerActivity, profile, schedule

    from tests.profiling.conftest import small_step

    path = os.path.join(tempfile.mkdtemp(), "t.json")
    step = small_step()
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for _ in range(4):
            step()
            prof.step()
    got = entry(load_trace(path))
    for evt in prof.key_averages():
        n, s, t = got[evt.key]
        assert n == evt.count, evt.key
        assert s == pytest.approx(evt.self_cpu_time_total, rel=0.02, abs=2 * n), evt.key
        assert t == pytest.approx(evt.cpu_time_total, rel=0.02, abs=2 * n), evt.key


def _gpu_activity(entry):
    d = SimulatedDevice(launch_overhead_us=5)
    d.copy(1_000_000, pinned=True, non_blocking=True)
    for i in range(3):
        d.launch(f"k{i % 2}", 30)
    d.host_work(300)
    for _ in range(4):
        d.launch("tiny", 1)
    trace = d.chrome_trace()
    for k, gap in ((2, 0.0), (5, 4.0), (1, 400.0)):
        got = entry(trace, k=k, min_gap_us=gap)
        assert got["gaps"] == gpu_idle_gaps(trace, min_gap_us=gap)
        assert got["top_kernels"] == top_kernels(trace, k)
        assert got["utilization"] == pytest.approx(gpu_utilization(trace))
    assert entry({"traceEvents": []})["utilization"] is None


def _train_fast(entry):
    for seed, steps, batch in ((0, 3, 8), (1, 1, 1), (2, 0, 4)):
        batches = make_batches(seed, steps, batch)
        with SyncDetector():
            expected = train_with_hidden_syncs(make_model(seed), batches)
        with SyncDetector() as det:
            model = make_model(seed)
        det.events.clear()
        with det:
            got = entry(model, batches)
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-6)
        assert len(det.implicit()) == (1 if steps else 0) and det.stalls() == []
    with pytest.raises(ValueError):
        with SyncDetector():
            entry(make_model(0), make_batches(0, 3, 4, all_unlabelled_at=2))


def _capstone_costs(entry):
    path = os.path.join(tempfile.mkdtemp(), "capstone.json")
    names = entry(*capstone_parts(batch_size=2, n_layer=1), path)
    trace = load_trace(path)
    steps = [e for e in trace["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    assert len(steps) == 2
    aten = {k: v for k, v in op_stats(trace).items() if k.startswith("aten::")}
    assert names == [k for k, _ in sorted(aten.items(), key=lambda kv: (-kv[1].self_us, kv[0]))[:3]]


JUDGES = {f"profiling.{name}": globals()[f"_{name}"] for name in EXERCISES}


def test_notebook_source_runs_and_its_solutions_pass(monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    import IPython.display

    monkeypatch.setattr(IPython.display, "display", lambda *a, **k: None)
    judged = []

    def check(exercise_id, entry, *, hidden=False, device=None):
        assert exercise_id in JUDGES, f"unknown exercise id {exercise_id!r}"
        assert callable(entry)
        if not hidden:
            JUDGES[exercise_id](entry)
            judged.append(exercise_id)

    namespace = {"__name__": "__main__"}
    threads = torch.get_num_threads()
    try:
        for kind, code in _cells():
            if kind == "markdown":
                continue
            assert kind.split()[0] in ("setup", "code", "answer", "tests"), kind
            exec(compile(code, f"<{SOURCE.name} [{kind}]>", "exec"), namespace)
            if kind == "setup":
                namespace["check"] = check
    finally:
        torch.set_num_threads(threads)
    assert judged == [f"profiling.{n}" for n in EXERCISES]


def test_exercise_markers_are_paired_and_chapters_referred_to_by_slug():
    cells = _cells()
    answers = [k.split()[1] for k, _ in cells if k.startswith("answer")]
    tests = [k.split()[1] for k, _ in cells if k.startswith("tests")]
    assert answers == tests == list(EXERCISES)
    text = SOURCE.read_text()
    assert "### BEGIN SOLUTION" in text and not re.search(r"[Cc]hapter \d", text)
    assert set(re.findall(r"\{\{chapter (\w+)\}\}", text)) <= {"strides", "autograd", "modules", "dispatch",
                                                               "allocator", "amp", "distributed", "kernels",
                                                               "compile", "gpt"}
