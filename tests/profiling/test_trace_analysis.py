"""Trace analysis against torch: op_stats on real CPU traces agree with prof.key_averages() (self and
total time, counts); nesting, GPU gaps and kernel attribution on hand-built traces with boundary cases."""
import gzip
import inspect
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch.autograd.profiler_util import FunctionEvent

from ptinternals.profiling.trace_analysis import (
    HOST_CATEGORIES,
    build_tree,
    busy_intervals,
    compare_with_key_averages,
    complete_events,
    gpu_idle_gaps,
    gpu_utilization,
    key_averages_categories,
    keys_inside_steps,
    load_trace,
    op_stats,
    remove_dup_nodes,
    top_kernels,
    top_ops,
)


def test_op_stats_agree_with_key_averages(cpu_trace):
    path, data, key_averages = cpu_trace
    stats = op_stats(path)
    assert compare_with_key_averages(stats, key_averages) == []
    assert set(stats) == {e.key for e in key_averages}
    assert stats["ProfilerStep*"].count == 2 and stats["forward"].count == 2
    assert all(s.self_us <= s.total_us + 1e-6 for s in stats.values())


def test_op_stats_with_python_frames_agree_too(cpu_trace_with_stack):
    """torch 2.13's key_averages() counts Python frames as events, torch 2.11's leaves them out: op_stats
    agrees with the installed torch's table through key_averages_categories, and the other rule does not."""
    path, data, key_averages = cpu_trace_with_stack
    counted = key_averages_categories(path)
    assert ("python_function" in counted) == ("is_python_function" in inspect.signature(FunctionEvent).parameters)
    inside = keys_inside_steps(path, host_categories=counted)
    assert {"forward", "backward", "optimizer", "aten::addmm"} <= inside
    assert compare_with_key_averages(op_stats(path, host_categories=counted), key_averages, keys=inside) == []
    # the other rule moves time between the ops and the frames: their self times no longer agree
    other = HOST_CATEGORIES if "python_function" in counted else HOST_CATEGORIES + ("python_function",)
    assert compare_with_key_averages(op_stats(path, host_categories=other), key_averages, abs_us=0.5, rel=0.0,
                                     keys=inside) != []
    # op_stats' default is 2.13's rule on every torch
    assert op_stats(path) == op_stats(path, host_categories=HOST_CATEGORIES + ("python_function",))


def test_self_times_add_up_to_the_step(cpu_trace):
    _, data, _ = cpu_trace
    events = complete_events(data, ("cpu_op", "user_annotation"))
    roots = build_tree(events)
    steps = [r for r in roots if r.name.startswith("ProfilerStep#")]
    assert len(steps) == 2
    for root in steps:
        subtree, todo = [], [root]
        while todo:
            e = todo.pop()
            subtree.append(e)
            todo += e.children
        self_sum = sum(e.dur - sum(c.dur for c in e.children) for e in subtree)
        assert self_sum == pytest.approx(root.dur, abs=1e-3)


def _x(name, ts, dur, cat="cpu_op", tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_nesting_boundaries():
    trace = {"traceEvents": [
        _x("parent", 0, 10), _x("child_to_end", 4, 6), _x("starts_at_end", 10, 2),
        _x("partial", 8, 5, tid=2), _x("outer2", 0, 10, tid=2), _x("zero", 5, 0), {"ph": "M", "name": "meta"},
    ]}
    stats = op_stats(trace)
    assert stats["parent"].self_us == 4                 # child_to_end [4, 10] is inside [0, 10]
    assert stats["child_to_end"].self_us == 6 - 0      # the zero-length op at 5 is its child, costs 0
    assert stats["starts_at_end"].self_us == 2          # starts where the parent ends: a sibling
    assert stats["outer2"].self_us == 10 and stats["partial"].self_us == 5   # partial overlap: no link


def test_an_op_calling_itself_is_folded_like_key_averages():
    trace = {"traceEvents": [
        _x("aten::mean", 0, 10), _x("aten::mean", 1, 8), _x("aten::sum", 2, 3, **{"External id": 5}),
        _x("k", 20, 4, cat="kernel", tid=7, **{"External id": 5}),
        _x("aten::add", 20, 10), _x("aten::add", 21, 2), _x("aten::add", 24, 2),    # two children: kept
    ]}
    s = op_stats(trace)
    assert (s["aten::mean"].count, s["aten::mean"].self_us, s["aten::mean"].total_us) == (1, 7, 10)
    assert s["aten::add"].count == 3
    assert s["aten::mean"].device_total_us == 4 and s["aten::sum"].device_self_us == 4


@st.composite
def nested_trace(draw):
    """Random well-nested intervals on two threads (each child inside its parent)."""
    events = []

    def grow(lo, hi, depth, tid):
        t = lo
        while t < hi and depth < 4 and draw(st.booleans()):
            start = draw(st.integers(t, hi))
            end = draw(st.integers(start, hi))
            events.append(_x(draw(st.sampled_from("abc")), start, end - start, tid=tid))
            grow(start, end, depth + 1, tid)
            t = end + 1
    for tid in (1, 2):
        grow(0, draw(st.integers(0, 200)), 0, tid)
    return {"traceEvents": events}


@given(nested_trace())
def test_self_time_partitions_each_thread(trace):
    stats = op_stats(trace)
    events = complete_events(trace, ("cpu_op",))
    roots = build_tree(events)
    assert sum(s.self_us for s in stats.values()) == pytest.approx(sum(r.dur for r in roots))
    assert sum(s.count for s in stats.values()) == len(remove_dup_nodes(events))


def test_device_time_goes_to_the_launching_op():
    trace = {"traceEvents": [
        _x("aten::linear", 0, 20, **{"External id": 1}),
        _x("aten::addmm", 2, 10, **{"External id": 2}),
        _x("cudaLaunchKernel", 3, 2, cat="cuda_runtime", correlation=9, **{"External id": 2}),
        _x("gemm_kernel", 30, 50, cat="kernel", tid=7, **{"External id": 2}),
        _x("Memcpy HtoD", 100, 5, cat="gpu_memcpy", tid=8, **{"External id": 1}),
    ]}
    s = op_stats(trace)
    assert (s["aten::addmm"].device_self_us, s["aten::addmm"].device_total_us) == (50, 50)
    assert (s["aten::linear"].device_self_us, s["aten::linear"].device_total_us) == (5, 55)
    assert s["aten::addmm"].self_us == 8               # the runtime call is a child on the host
    assert top_kernels(trace, 5) == [("gemm_kernel", 1, 50.0), ("Memcpy HtoD", 1, 5.0)]


def test_gpu_gaps_and_utilization():
    kernels = [_x("k1", 0, 10, cat="kernel", tid=7), _x("k2", 5, 10, cat="kernel", tid=8),   # overlap: busy 0-15
               _x("k3", 15, 5, cat="kernel", tid=7),                                          # touches: no gap
               _x("m", 30, 10, cat="gpu_memset", tid=7), _x("k4", 45, 5, cat="kernel", tid=8)]
    trace = {"traceEvents": kernels}
    assert gpu_idle_gaps(trace) == [(20, 30), (40, 45)]
    assert gpu_idle_gaps(trace, min_gap_us=5) == [(20, 30)]     # a gap equal to the threshold is left out
    assert gpu_utilization(trace) == pytest.approx(35 / 50)
    assert gpu_utilization({"traceEvents": [_x("a", 0, 1)]}) is None
    assert gpu_utilization({"traceEvents": [_x("k", 3, 0, cat="kernel")]}) == 1.0
    assert gpu_idle_gaps({"traceEvents": []}) == []


def test_rankings_break_ties_by_name():
    trace = {"traceEvents": [_x("b", 0, 5), _x("a", 10, 5), _x("c", 20, 1),
                             _x("kb", 0, 5, cat="kernel", tid=7), _x("ka", 10, 5, cat="kernel", tid=7)]}
    assert [n for n, _ in top_ops(op_stats(trace), 2)] == ["a", "b"]
    assert [n for n, _, _ in top_kernels(trace, 2)] == ["ka", "kb"]
    assert top_kernels(trace, 0) == []


def test_busy_intervals_merge():
    assert busy_intervals([(5, 6), (0, 2), (2, 3), (1, 1)]) == [(0, 3), (5, 6)]
    with pytest.raises(ValueError, match="ends before"):
        busy_intervals([(3, 1)])


def test_load_trace_formats_and_errors(tmp_path, cpu_trace):
    path, data, _ = cpu_trace
    gz = tmp_path / "t.json.gz"
    with gzip.open(gz, "wt") as f:
        json.dump(data, f)
    assert op_stats(str(gz)).keys() == op_stats(path).keys()
    with pytest.raises(TypeError, match="path or a dict"):
        load_trace(3)
    with pytest.raises(ValueError, match="traceEvents"):
        load_trace({"events": []})
    with pytest.raises(ValueError, match="by must be"):
        top_ops({}, 3, by="wall")
    with pytest.raises(ValueError, match="min_gap_us"):
        gpu_idle_gaps(data, min_gap_us=-1)


@pytest.mark.gpu
def test_cuda_trace_agrees_with_key_averages(tmp_path):
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    x = torch.randn(256, 1024, device="cuda")
    path = str(tmp_path / "cuda.json")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for _ in range(4):
            model(x).sum().backward()
            torch.cuda.synchronize()
            prof.step()
    stats = op_stats(path)
    inside = keys_inside_steps(path)
    assert compare_with_key_averages(stats, prof.key_averages(), keys=inside, device=True) == []
    assert top_kernels(path, 3) and gpu_utilization(path) is not None


def test_the_exercise_shapes_of_the_analysis(cpu_trace):
    from ptinternals.profiling.trace_analysis import gpu_activity, op_times

    path, data, _ = cpu_trace
    table = op_times(data)
    assert table["ProfilerStep*"][0] == 2 and all(len(row) == 3 for row in table.values())
    assert gpu_activity(data) == {"gaps": [], "top_kernels": [], "utilization": None}
    with pytest.raises(ValueError, match="k must be an int >= 0"):
        gpu_activity(data, k=-1)
    with pytest.raises(ValueError, match="min_gap_us must be >= 0"):
        gpu_activity(data, min_gap_us=-0.5)
    with pytest.raises(TypeError, match="trace must be a path or a dict"):
        op_times(42)
