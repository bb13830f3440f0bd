"""The model's snapshot is the real format: torch.cuda._memory_viz reads it; restore_segments rebuilds it."""

import pickle

import pytest
from torch.cuda import _memory_viz

from ptinternals.allocator import CachingAllocator, GiB, MiB, make_snapshot, replay, restore_segments
from ptinternals.allocator.workloads import training_step_trace


@pytest.fixture(scope="module")
def snapshot():
    r = replay(training_step_trace(steps=2))
    a = r.allocator
    x = a.malloc(3 * MiB, stream=0)
    a.record_stream(x, 9)
    a.free(x)  # leave a pending-free block in the snapshot
    return a.snapshot()


def test_snapshot_fields(snapshot):
    seg = snapshot["segments"][0]
    for key in (
        "device",
        "address",
        "total_size",
        "allocated_size",
        "active_size",
        "requested_size",
        "stream",
        "segment_type",
        "segment_pool_id",
        "is_expandable",
        "frames",
        "blocks",
    ):
        assert key in seg
    states = {b["state"] for s in snapshot["segments"] for b in s["blocks"]}
    assert states == {"active_allocated", "active_pending_free", "inactive"}
    for s in snapshot["segments"]:
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
        addr = s["address"]
        for b in s["blocks"]:
            assert b["address"] == addr
            addr += b["size"]
    actions = {e["action"] for e in snapshot["device_traces"][0]}
    assert {"alloc", "free_requested", "free_completed", "segment_alloc"} <= actions
    assert pickle.loads(pickle.dumps(snapshot)) == snapshot


def test_memory_viz_reads_the_model_snapshot(snapshot):
    text = _memory_viz.segsum(snapshot)  # asserts its own byte accounting
    assert f"segments: {len(snapshot['segments'])}" in text
    reserved = sum(s["total_size"] for s in snapshot["segments"])
    assert f"total_reserved: {_memory_viz.Bytes(reserved)}" in text
    trace_text = _memory_viz.trace(snapshot)
    assert "cudaMalloc(" in trace_text and "TOTAL MEM" in trace_text
    for html in (
        _memory_viz.trace_plot(snapshot),
        _memory_viz.segment_plot(snapshot),
        _memory_viz.trace_plot(snapshot, plot_segments=True),
    ):
        assert html.startswith("\n<!DOCTYPE html>") and "snapshot.pickle" in html
    flame = _memory_viz.segments(snapshot, format_flamegraph=lambda lines: lines)
    assert "active_allocated" in flame
    assert "stream_0" in _memory_viz.memory(snapshot, format_flamegraph=lambda lines: lines)
    filtered = _memory_viz.filter_alloc_free_pairs(pickle.loads(pickle.dumps(snapshot)))
    assert len(filtered["device_traces"][0]) < len(snapshot["device_traces"][0])


def test_restore_segments_round_trip(snapshot):
    a = CachingAllocator(4 * GiB)
    restored = restore_segments(a, snapshot["segments"])
    again = a.snapshot()
    assert again["segments"] == snapshot["segments"]
    assert len(restored.live) == sum(
        b["state"] == "active_allocated" for s in snapshot["segments"] for b in s["blocks"]
    )
    assert len(restored.pending) == 1
    a.check_invariants()
    assert a.max_memory_reserved() == a.memory_reserved()  # stats count from the restored state
    (stream,) = restored.pending.values()
    a.sync(stream)
    a.malloc(512)  # process_events frees the pending block
    assert all(b["state"] != "active_pending_free" for s in a.snapshot()["segments"] for b in s["blocks"])


def test_restore_errors(snapshot):
    a = CachingAllocator(4 * GiB)
    a.malloc(10)
    with pytest.raises(ValueError, match="empty allocator"):
        restore_segments(a, snapshot["segments"])
    with pytest.raises(ValueError, match="total_size"):
        bad = [dict(snapshot["segments"][0], total_size=1)]
        restore_segments(CachingAllocator(GiB), bad)
    with pytest.raises(ValueError, match="address"):
        restore_segments(CachingAllocator(GiB), [{"blocks": []}])
    with pytest.raises(NotImplementedError, match="expandable"):
        restore_segments(CachingAllocator(GiB), [dict(snapshot["segments"][0], is_expandable=True)])
    with pytest.raises(TypeError, match="allocator"):
        make_snapshot("not an allocator")


def test_restore_keeps_private_pool_segments_aside(snapshot):
    seg = dict(snapshot["segments"][0], segment_pool_id=(1, 0), address=1 << 44)
    seg["blocks"] = [
        dict(b, address=b["address"] - snapshot["segments"][0]["address"] + (1 << 44)) for b in seg["blocks"]
    ]
    a = CachingAllocator(4 * GiB)
    restore_segments(a, [seg])
    assert a.memory_reserved() == seg["total_size"] and a.num_segments() == 1
    assert a.snapshot()["segments"][0]["segment_pool_id"] == (1, 0)
    a.check_invariants()
    b = a.malloc(512)  # never served from the private pool
    assert b.pool is a.small_blocks and a.num_segments() == 2
