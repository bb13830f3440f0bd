"""The chapter's figures draw real traces and simulated runs, and reject what they cannot draw."""
import pytest
from matplotlib.figure import Figure

from ptinternals.profiling.async_device import SimulatedDevice
from ptinternals.profiling.overlap import StepCosts, simulate_training
from ptinternals.viz.profiling import plot_simulated_timeline, plot_trace_timeline


def _row_labels(fig):
    return [t.get_text() for t in fig.axes[0].texts if t.get_text().startswith(("host", "GPU", "stream"))]


def test_trace_timeline_of_a_real_trace(cpu_trace):
    path, data, _ = cpu_trace
    fig = plot_trace_timeline(path, max_depth=3)
    assert isinstance(fig, Figure)
    assert len(_row_labels(fig)) == 1                   # one host thread (its lanes are unlabelled)
    assert len(fig.axes[0].patches) > 10
    zoom = plot_trace_timeline(data, window=(0, 50))
    assert zoom.axes[0].get_xlim() == (0, 50)


def test_trace_timeline_with_device_rows():
    ev = lambda name, cat, tid, ts, dur: {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts,
                                          "dur": dur, "args": {}}
    trace = {"traceEvents": [ev("aten::mm", "cpu_op", 1, 0, 10), ev("gemm", "kernel", 7, 12, 30),
                             ev("Memcpy HtoD", "gpu_memcpy", 8, 0, 5)]}
    labels = _row_labels(plot_trace_timeline(trace))
    assert labels == ["host 1", "GPU stream 7", "GPU stream 8"]


def test_simulated_timeline_rows():
    tl = simulate_training(StepCosts(1_000_000, 30, 5), 4, "prefetch", device=SimulatedDevice(launch_overhead_us=1))
    labels = _row_labels(plot_simulated_timeline(tl.device))
    assert labels == ["host", "stream 0 (default)", "stream 1"]


def test_bad_input():
    with pytest.raises(ValueError, match="nothing"):
        plot_simulated_timeline(SimulatedDevice())
    with pytest.raises(ValueError, match="no host ops"):
        plot_trace_timeline({"traceEvents": []})
    with pytest.raises(ValueError, match="max_depth"):
        plot_trace_timeline({"traceEvents": []}, max_depth=0)
    trace = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 1}]}
    with pytest.raises(ValueError, match="window"):
        plot_trace_timeline(trace, window=(5, 5))
