"""The training-step timeline: the closed form equals the simulator on every loop, including the
boundary classes (zero-length copies and kernels, copy exactly as long as compute, host-bound steps);
record_stream prevents the prefetch race."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ptinternals.profiling.async_device import SimulatedDevice
from ptinternals.profiling.overlap import LOOPS, StepCosts, predict_step_us, simulate_training

PINNED, PAGEABLE = 50.0, 12.5   # GB/s: 1 us pinned = 50_000 bytes, 1 us pageable = 12_500 bytes


@st.composite
def step_costs(draw):
    compute = draw(st.sampled_from([0, 1, 4, 10, 25]))
    # copies: zero, equal to compute exactly (pinned), or arbitrary
    copy_us = draw(st.sampled_from([0, compute, compute, 3, 12, 40]))
    host = draw(st.sampled_from([0, 0, 2, compute, 30]))
    return StepCosts(int(copy_us * 50_000), compute, host, draw(st.integers(1, 3)))


@given(step_costs(), st.sampled_from(LOOPS), st.booleans(), st.booleans())
def test_closed_form_equals_the_simulator(costs, loop, pinned, item):
    d = SimulatedDevice(launch_overhead_us=0, pinned_gb_per_s=PINNED, pageable_gb_per_s=PAGEABLE)
    tl = simulate_training(costs, 7, loop, pinned=pinned, item=item, device=d)
    predicted = predict_step_us(d.copy_us(costs.batch_bytes, True), d.copy_us(costs.batch_bytes, False),
                                costs.compute_us, costs.host_us, loop, pinned=pinned, item=item)
    assert tl.steady_step_us == pytest.approx(predicted, abs=1e-9)
    assert d.races == []                      # record_stream is on


@given(step_costs(), st.sampled_from(LOOPS), st.booleans())
def test_launch_overheads_only_add(costs, loop, pinned):
    d = SimulatedDevice(launch_overhead_us=1.5, pinned_gb_per_s=PINNED, pageable_gb_per_s=PAGEABLE)
    tl = simulate_training(costs, 7, loop, pinned=pinned, device=d)
    predicted = predict_step_us(d.copy_us(costs.batch_bytes, True), d.copy_us(costs.batch_bytes, False),
                                costs.compute_us, costs.host_us, loop, pinned=pinned)
    assert tl.steady_step_us >= predicted - 1e-9


def test_overlap_hides_the_copy():
    costs = StepCosts(batch_bytes=1_000_000, compute_us=30, host_us=5)   # 20 us pinned copy
    t = {loop: simulate_training(costs, 8, loop).steady_step_us for loop in LOOPS}
    assert t == {"blocking": 50, "async": 50, "prefetch": 30}
    assert simulate_training(costs, 8, "prefetch", item=True).steady_step_us == 35   # item: + host time


@pytest.mark.parametrize("compute_us, races", [(20, False), (20.5, True), (100, True), (5, False)])
def test_prefetch_without_record_stream_races_when_compute_outlasts_a_copy(compute_us, races):
    costs = StepCosts(batch_bytes=1_000_000, compute_us=compute_us)      # copy: 20 us
    d = SimulatedDevice(launch_overhead_us=0)
    simulate_training(costs, 6, "prefetch", record_stream=False, device=d)
    assert bool(d.races) is races              # copy == compute exactly: the write starts as the read ends
    d = SimulatedDevice(launch_overhead_us=0)
    simulate_training(costs, 6, "prefetch", record_stream=True, device=d)
    assert d.races == []


def test_bad_arguments():
    costs = StepCosts(10, 1.0)
    with pytest.raises(ValueError, match="loop"):
        simulate_training(costs, 3, "overlap")
    with pytest.raises(ValueError, match="steps"):
        simulate_training(costs, 0, "async")
    with pytest.raises(ValueError, match="batch_bytes"):
        StepCosts(-1, 1.0)
    with pytest.raises(ValueError, match="compute_us"):
        StepCosts(1, float("nan"))
    with pytest.raises(ValueError, match="n_kernels"):
        StepCosts(1, 1.0, n_kernels=0)
    with pytest.raises(ValueError, match="host_us"):
        predict_step_us(1, 1, 1, -1, "async")
    with pytest.raises(ValueError, match="3 steps"):
        _ = simulate_training(costs, 2, "async").steady_step_us


def test_the_prefetch_loop_runs_and_rejects_bad_arguments():
    from ptinternals.profiling.async_device import SimulatedDevice
    from ptinternals.profiling.overlap import train_prefetch

    dev = SimulatedDevice(launch_overhead_us=0)
    train_prefetch(dev, [1_000_000] * 4, 30.0, 5.0)
    ends = [r.end for r in dev.records if r.kind == "kernel"]
    assert ends[2] - ends[1] == pytest.approx(30.0) and dev.races == []
    for batches, match in (([1, -2], r"batches\[1\] must be an int >= 0"), ("12", "must be a list"),
                           ([1.5], r"batches\[0\]")):
        with pytest.raises((ValueError, TypeError), match=match):
            train_prefetch(SimulatedDevice(), batches, 1.0, 1.0)
    with pytest.raises(ValueError, match="compute_us must be a number >= 0"):
        train_prefetch(SimulatedDevice(), [1], -1.0, 1.0)
