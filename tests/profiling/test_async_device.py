"""The simulated asynchronous device: launches return at once, streams order work, events and
copies behave as CUDA's do, the launch queue is finite, and the race check knows record_stream."""
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ptinternals.profiling.async_device import SimulatedDevice


def test_launch_returns_before_the_kernel_runs():
    d = SimulatedDevice(launch_overhead_us=5)
    rec = d.launch("matmul", 1000)
    assert d.host_time == 5 and (rec.start, rec.end) == (5, 1005)
    assert not d.current_stream.query()
    d.synchronize()
    assert d.host_time == 1005 and d.current_stream.query()


def test_one_stream_runs_in_order_two_streams_overlap():
    d = SimulatedDevice(launch_overhead_us=1)
    a = d.launch("a", 10)
    b = d.launch("b", 10)
    s = d.Stream()
    c = d.launch("c", 10, s)
    assert b.start == a.end                       # queued behind a
    assert c.start == 3 and c.start < a.end        # another stream: overlaps
    assert d.device_busy_us() == 20               # union of [1, 21] and [3, 13]


def test_events_measure_device_time_and_order_streams():
    d = SimulatedDevice(launch_overhead_us=2)
    start, end = d.Event(), d.Event()
    start.record()
    d.launch("k", 40)
    end.record()
    with pytest.raises(RuntimeError, match="not completed"):
        start.elapsed_time(end)
    end.synchronize()
    assert start.elapsed_time(end) == pytest.approx(0.042)   # ms: the launch + the kernel (stream was idle)
    side = d.Stream()
    side.wait_event(end)
    k = d.launch("after", 1, side)
    assert k.start >= end.time


def test_event_errors():
    d = SimulatedDevice()
    a, b = d.Event(), d.Event()
    with pytest.raises(RuntimeError, match="recorded"):
        a.elapsed_time(b)
    c, e = d.Event(enable_timing=False), d.Event(enable_timing=False)
    c.record()
    e.record()
    with pytest.raises(RuntimeError, match="enable_timing"):
        c.elapsed_time(e)
    d.current_stream.wait_event(d.Event())        # never recorded: a no-op, like CUDA
    assert d.launch("k", 1).start == d.launch_overhead_us


def test_the_launch_queue_is_finite():
    d = SimulatedDevice(launch_overhead_us=1, queue_depth=2)
    d.launch("a", 100)
    d.launch("b", 100)
    assert d.host_time == 2
    d.launch("c", 100)                            # queue full: waits for a (ends at 101)
    assert d.host_time == 102


def test_first_call_is_slow_once_per_kernel():
    d = SimulatedDevice(launch_overhead_us=0, first_call_us=500)
    r1, r2, r3 = d.launch("k", 10), d.launch("k", 10), d.launch("other", 10)
    assert (r1.end - r1.start, r2.end - r2.start, r3.end - r3.start) == (510, 10, 510)


def test_copies_pinned_pageable_blocking():
    d = SimulatedDevice(launch_overhead_us=0, pinned_gb_per_s=50, pageable_gb_per_s=10)
    nbytes = 1_000_000                            # 20 us pinned, 100 us pageable
    d.launch("busy", 1000)
    rec = d.copy(nbytes, pinned=True, non_blocking=True)
    assert d.host_time == 0 and (rec.start, rec.end) == (1000, 1020)   # queued behind the kernel
    rec = d.copy(nbytes, pinned=False, non_blocking=True)
    assert d.host_time == 100 and rec.end - rec.start == 20            # host staged, then DMA
    rec = d.copy(nbytes, pinned=False, non_blocking=False)
    assert d.host_time == rec.end == 1140                                # copy + stream sync
    assert d.copy_us(0, True) == 0


@st.composite
def programs(draw):
    ops = []
    for _ in range(draw(st.integers(0, 25))):
        kind = draw(st.sampled_from(["launch", "launch", "copy", "record_wait", "sync", "host"]))
        ops.append((kind, draw(st.integers(0, 3)), draw(st.sampled_from([0, 0.5, 1, 7, 7, 100])), draw(st.booleans())))
    return ops


@given(programs(), st.sampled_from([0, 1, 5]), st.integers(1, 4))
def test_invariants_of_any_program(ops, overhead, depth):
    d = SimulatedDevice(launch_overhead_us=overhead, queue_depth=depth)
    streams = [d.current_stream] + [d.Stream() for _ in range(3)]
    last_host = 0.0
    for kind, s, us, flag in ops:
        if kind == "launch":
            d.launch(f"k{s}", us, streams[s])
        elif kind == "copy":
            d.copy(int(us * 1000), "h2d", pinned=flag, non_blocking=flag, stream=streams[s])
        elif kind == "record_wait":
            ev = d.Event()
            ev.record(streams[s])
            streams[(s + 1) % 4].wait_event(ev)
        elif kind == "sync":
            d.synchronize()
            assert all(r.end <= d.host_time for r in d.records)
        else:
            d.host_work(us)
        assert d.host_time >= last_host
        last_host = d.host_time
    work = [r for r in d.records if r.stream >= 0 and r.kind != "event"]
    for sid in range(4):
        mine = [r for r in work if r.stream == sid]
        assert all(a.end <= b.start for a, b in zip(mine, mine[1:]))   # a stream runs one op at a time, in order
    assert all(r.start >= r.launch_end for r in work)                  # nothing starts before its launch ends
    assert all(r.end - r.start >= 0 for r in work)
    span = max((r.end for r in work), default=0.0)
    assert 0 <= d.device_busy_us(("kernel", "h2d", "d2h")) <= span


def test_record_stream_and_races():
    d = SimulatedDevice(launch_overhead_us=0)
    side = d.Stream()
    buf = d.alloc(1024, side)
    d.copy(1024, pinned=True, non_blocking=True, stream=side, buffer=buf)
    ready = d.Event()
    ready.record(side)
    d.current_stream.wait_event(ready)
    d.launch("compute", 100, reads=[buf])         # reads until t=100 (stream 0)
    d.free(buf)                                    # no record_stream: the side stream may reuse it now
    again = d.alloc(1024, side)
    assert again.block == buf.block
    d.copy(1024, pinned=True, non_blocking=True, stream=side, buffer=again)   # writes while compute reads
    assert len(d.races) == 1 and "overlaps compute" in d.races[0][0]

    d = SimulatedDevice(launch_overhead_us=0)
    side = d.Stream()
    buf = d.alloc(1024, side)
    d.launch("compute", 100, reads=[buf])
    buf.record_stream(d.current_stream)
    d.free(buf)
    assert d.alloc(1024, side).block != buf.block  # pending until compute ends: a new block
    assert d.races == []


def test_zero_length_accesses_and_same_stream_reuse_do_not_race():
    d = SimulatedDevice(launch_overhead_us=0)
    buf = d.alloc(8)
    d.launch("read", 0, reads=[buf])
    side = d.Stream()
    d.launch("write", 0, side, writes=[buf])     # both zero-length at t=0: no shared instant
    d.free(buf)
    again = d.alloc(8)                            # same stream: ordered after the read, safe
    d.launch("write2", 5, writes=[again])
    assert d.races == []
    d.launch("late", 1, reads=[buf])              # the old handle, after free
    assert "after it was freed" in d.races[-1][0]


@pytest.mark.parametrize("kwargs, match", [
    ({"launch_overhead_us": -1}, "launch_overhead_us"), ({"first_call_us": math.nan}, "first_call_us"),
    ({"launch_overhead_us": True}, "launch_overhead_us"), ({"queue_depth": 0}, "queue_depth"),
    ({"pinned_gb_per_s": 0}, "pinned_gb_per_s"), ({"host_jitter": (1.5, 1)}, "host_jitter"),
])
def test_bad_device_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        SimulatedDevice(**kwargs)


def test_bad_call_arguments():
    d = SimulatedDevice()
    with pytest.raises(ValueError, match="duration_us"):
        d.launch("k", -1)
    with pytest.raises(ValueError, match="name"):
        d.launch("", 1)
    with pytest.raises(ValueError, match="direction"):
        d.copy(4, "d2d")
    with pytest.raises(ValueError, match="nbytes"):
        d.copy(-4)
    buf = d.alloc(4)
    d.free(buf)
    with pytest.raises(ValueError, match="already free"):
        d.free(buf)


def test_a_graph_replay_pays_one_launch():
    kernels = [(f"k{i}", 2) for i in range(50)]
    eager = SimulatedDevice(launch_overhead_us=10)
    for name, us in kernels:
        eager.launch(name, us)
    eager.synchronize()
    graph = SimulatedDevice(launch_overhead_us=10)
    graph.launch_graph(kernels)
    graph.synchronize()
    assert (eager.host_time, graph.host_time) == (10 * 50 + 2, 10 + 2 * 50)   # launch-bound vs kernel-bound
    with pytest.raises(ValueError, match="at least one"):
        graph.launch_graph([])


def test_the_simulated_run_as_a_chrome_trace():
    from ptinternals.profiling.trace_analysis import gpu_idle_gaps, op_stats, top_kernels

    d = SimulatedDevice(launch_overhead_us=5)
    d.host_work(20)
    d.copy(1_000_000, pinned=True, non_blocking=True)
    d.launch("gemm", 100)
    d.host_work(200)
    d.launch("relu", 10)
    d.synchronize()
    trace = d.chrome_trace()
    assert top_kernels(trace, 3) == [("gemm", 1, 100.0), ("Memcpy HtoD", 1, 20.0), ("relu", 1, 10.0)]
    assert op_stats(trace)["aten::gemm"].device_self_us == 100
    # copy 25-45, gemm 45-145 (launched at 30, waits for the copy); 200 us of Python; relu from 235
    assert gpu_idle_gaps(trace) == [(145.0, 235.0)]       # the host's Python starves the GPU
