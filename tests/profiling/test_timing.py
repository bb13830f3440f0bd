"""Timers: naive timing measures the launch, event timing the kernel; medians and IQR like numpy;
torch.utils.benchmark for real runs."""
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ptinternals.profiling.async_device import SimulatedDevice
from ptinternals.profiling.timing import (
    benchmark_torch,
    cpu_backend,
    cuda_backend,
    event_time_ms,
    naive_time_ms,
    quartiles,
    synced_time_ms,
)


@given(st.sampled_from([0, 1, 3, 50, 10_000]), st.sampled_from([0, 2, 5]), st.sampled_from([0, 100, 5000]))
def test_naive_timing_measures_the_launch_events_measure_the_kernel(kernel_us, overhead, first_call):
    d = SimulatedDevice(launch_overhead_us=overhead, first_call_us=first_call)
    fn = lambda: d.launch("k", kernel_us)
    assert naive_time_ms(fn, d) == pytest.approx(overhead / 1e3)       # whatever the kernel costs
    r = event_time_ms(fn, d, warmup=1, reps=5)
    if kernel_us >= overhead:                                           # the queue stays full
        assert r.median == pytest.approx(kernel_us / 1e3) and r.iqr == 0
    else:                                                               # launch-bound: the launch shows
        assert r.median == pytest.approx(overhead / 1e3)
    s = synced_time_ms(fn, d, warmup=1, reps=5)
    assert s.median == pytest.approx((kernel_us + overhead) / 1e3)     # host clock includes the launch


def test_without_warmup_the_first_run_is_an_outlier_the_median_ignores():
    d = SimulatedDevice(launch_overhead_us=0, first_call_us=10_000)
    r = event_time_ms(lambda: d.launch("k", 100), d, warmup=0, reps=5)
    assert max(r.samples) == pytest.approx(10.1) and r.median == pytest.approx(0.1)
    mean = sum(r.samples) / len(r.samples)
    assert mean > 20 * r.median


def test_device_jitter_moves_the_mean_not_the_median():
    d = SimulatedDevice(launch_overhead_us=1, device_jitter=(0.1, 1000), seed=3)
    r = event_time_ms(lambda: d.launch("k", 50), d, warmup=2, reps=41)
    assert r.median == pytest.approx(0.05)
    assert sum(r.samples) / len(r.samples) > 1.5 * r.median


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=30))
def test_quartiles_agree_with_numpy(samples):
    q1, q2, q3 = quartiles(samples)
    np.testing.assert_allclose([q1, q2, q3], np.percentile(samples, [25, 50, 75]), rtol=1e-9, atol=1e-9)


def test_cpu_backend_and_torch_benchmark():
    a = torch.randn(32, 32)
    r = event_time_ms(lambda: a @ a, cpu_backend(), warmup=1, reps=3)
    assert len(r.samples) == 3 and r.median > 0 and r.method == "device events"
    b = benchmark_torch(lambda: a @ a, min_run_time=0.02)
    assert b.samples and min(b.samples) <= b.median <= max(b.samples)
    assert "torch.utils.benchmark" in str(b)


def test_bad_arguments():
    d = SimulatedDevice()
    with pytest.raises(ValueError, match="reps"):
        event_time_ms(lambda: None, d, reps=0)
    with pytest.raises(ValueError, match="warmup"):
        synced_time_ms(lambda: None, d, warmup=-1)
    with pytest.raises(ValueError, match="reps"):
        event_time_ms(lambda: None, d, reps=True)
    with pytest.raises(ValueError, match="empty"):
        quartiles([])
    with pytest.raises(TypeError, match="callable"):
        benchmark_torch(3)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            cuda_backend()


@pytest.mark.gpu
def test_on_a_gpu_naive_timing_is_wrong_and_events_are_right():
    x = torch.randn(4096, 4096, device="cuda")
    fn = lambda: x @ x
    backend = cuda_backend()
    events = event_time_ms(fn, backend, warmup=3, reps=10)
    torch.cuda.synchronize()
    naive = naive_time_ms(fn, backend)
    torch.cuda.synchronize()
    assert naive < 0.5 * events.median          # ~1.4 GFLOP/run: the kernel takes far longer than its launch
    ref = benchmark_torch(fn, min_run_time=0.2)
    assert ref.median == pytest.approx(events.median, rel=0.3)


def test_time_gpu_is_the_event_timer_as_a_pair():
    from ptinternals.profiling.async_device import SimulatedDevice
    from ptinternals.profiling.timing import time_gpu

    dev = SimulatedDevice(launch_overhead_us=5, first_call_us=1000)
    assert time_gpu(lambda: dev.launch("k", 250), dev, warmup=2, reps=5) == (0.25, 0.0)
    with pytest.raises(ValueError, match="reps must be an int >= 1"):
        time_gpu(lambda: None, dev, reps=0)
