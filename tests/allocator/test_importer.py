"""Recorded GPU histories -> model traces -> replay, compared step by step; and the GPU-only checks."""

import json

import pytest
import torch

from ptinternals.allocator import GiB, MiB, parse_alloc_conf, predict_peak_reserved, to_alloc_conf
from ptinternals.allocator.importer import insert_step_markers, trace_from_device_trace
from ptinternals.allocator.recorder import (
    compare_fidelity,
    compare_replay,
    oom_numbers,
    record_trace_on_gpu,
    replay_on_gpu,
)
from ptinternals.allocator.workloads import FRAGMENTATION_CAPACITY, fragmenting_trace, random_trace

from .allocator_helpers import fake_recording

S1 = 94_000_000_000_000  # a side stream's cudaStream_t value


def test_handwritten_device_trace_translation():
    """Entries as torch.cuda.memory._snapshot() writes them (a 2-stream program with record_stream)."""
    base = 0x7F3A00000000
    entries = [
        {"action": "segment_alloc", "addr": base, "size": 20 * MiB, "stream": 0, "time_us": 1},
        {"action": "alloc", "addr": base, "size": 3 * MiB, "stream": 0, "time_us": 2},
        {"action": "alloc", "addr": base + 3 * MiB, "size": 1_500_000, "stream": 0, "time_us": 3},
        {"action": "free_requested", "addr": base, "size": 3 * MiB, "stream": 0, "time_us": 4},
        {"action": "free_completed", "addr": base, "size": 3 * MiB, "stream": 0, "time_us": 5},
        {"action": "free_requested", "addr": base + 3 * MiB, "size": 1_500_000, "stream": 0, "time_us": 6},
        {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": 7},
        # the next malloc first processes events (the side stream is done), then cudaMallocs
        {"action": "free_completed", "addr": base + 3 * MiB, "size": 1_500_000, "stream": 0, "time_us": 8},
        {"action": "segment_alloc", "addr": base + 20 * MiB, "size": 2 * MiB, "stream": S1, "time_us": 9},
        {"action": "alloc", "addr": base + 20 * MiB, "size": 1000, "stream": S1, "time_us": 10},
    ]
    imp = trace_from_device_trace(entries)
    s = imp.trace[3][2]  # the stand-in stream of the deferred free
    assert imp.trace == [
        ("alloc", 0, 3 * MiB, 0),
        ("alloc", 1, 1_500_000, 0),
        ("free", 0),
        ("record_stream", 1, s),
        ("free", 1),
        ("sync", s),
        ("alloc", 2, 1000, S1),
    ]
    assert imp.segment_allocs == [(base, 20 * MiB), (base + 20 * MiB, 2 * MiB)]
    r = imp.replay()
    assert r.alloc_ptrs == imp.alloc_addrs  # same addresses as recorded
    assert r.reserved_bytes[-1] == 22 * MiB and r.segments[-1] == 2
    marked = insert_step_markers(imp, [5, 10])  # after entries[:5] (3 events) and at the end
    assert marked[3] == ("step", 0) and marked[-1] == ("step", 1) and len(marked) == len(imp.trace) + 2


def test_empty_cache_and_errors_in_translation():
    e = [
        {"action": "segment_alloc", "addr": 0, "size": 2 * MiB, "stream": 0},
        {"action": "alloc", "addr": 0, "size": 100, "stream": 0},
        {"action": "free_requested", "addr": 0, "size": 100, "stream": 0},
        {"action": "free_completed", "addr": 0, "size": 100, "stream": 0},
        {"action": "segment_free", "addr": 0, "size": 2 * MiB, "stream": 0},
    ]
    assert trace_from_device_trace(e).trace[-1] == ("empty_cache",)
    with pytest.raises(ValueError, match="never allocated"):
        trace_from_device_trace([{"action": "free_requested", "addr": 5, "size": 1, "stream": 0}])
    with pytest.raises(ValueError, match="action"):
        trace_from_device_trace([{"addr": 1}])
    with pytest.raises(ValueError, match="record_trace_on_gpu"):
        compare_fidelity({"format": "other"})


def _steps():
    """Four 'training steps' on two streams with record_stream, empty_cache and varied sizes."""
    steps = []
    for k in range(4):
        n = (3, 5, 2, 7)[k]
        ev = [("alloc", f"x{k}", n * MiB + 123, S1), ("record_stream", f"x{k}", 0)]
        ev += [("alloc", f"h{k}_{i}", (i + 1) * n * 300_000, 0) for i in range(6)]
        ev += [("free", f"h{k}_{i}") for i in (4, 1, 5, 0, 3, 2)]
        ev += [("free", f"x{k}"), ("alloc", f"big{k}", (30 + 4 * k) * MiB, 0), ("free", f"big{k}")]
        ev += [("sync", 0)] if k % 2 else []
        ev += [("empty_cache",)] if k == 2 else []
        steps.append(ev)
    return steps


def test_compare_fidelity_on_a_model_recording():
    prelude = [
        ("alloc", "w", 12 * MiB, 0),
        ("alloc", "tmp", 4 * MiB, 0),
        ("alloc", "p", 2 * MiB, 0),
        ("record_stream", "p", S1),
        ("free", "p"),
        ("free", "tmp"),
    ]
    recording, gpu = fake_recording(prelude, _steps())
    json.loads(json.dumps(recording))  # JSON-able
    report = compare_fidelity(recording)
    assert report["steps"] == 4 and report["exact_match_steps"] == 4, report["rows"]
    assert report["alloc_address_mismatches"] == 0 and report["oracle_misses"] == 0
    assert report["final_state_matches"] is True


def test_compare_fidelity_reproduces_the_oom_retry_path():
    steps = [[("alloc", "a", 300 * MiB, 0), ("free", "a")], [("alloc", "b", 350 * MiB, 0), ("free", "b")]]
    recording, gpu = fake_recording([], steps, capacity=512 * MiB)
    assert gpu.memory_stats()["num_alloc_retries"] == 1
    report = compare_fidelity(recording)
    assert report["exact_match_steps"] == 2 and any("OOM-retry" in n for n in report["notes"])
    assert ("empty_cache",) in trace_from_device_trace(recording["device_trace"]).trace


def test_alloc_conf_round_trip():
    cfg = parse_alloc_conf(
        "max_split_size_mb:128, roundup_power2_divisions:[64:8,256:4,>:1],garbage_collection_threshold:0.6"
    )
    assert cfg.max_split_size == 128 * MiB
    assert parse_alloc_conf(to_alloc_conf(cfg)) == cfg
    for bad, word in [
        ("max_split_size_mb:10", "too small"),
        ("foo:1", "unrecognized"),
        ("expandable_segments:maybe", "True or False"),
        ("max_split_size_mb", "':'"),
    ]:
        with pytest.raises(ValueError, match=word):
            parse_alloc_conf(bad)
    expandable = parse_alloc_conf("expandable_segments:True,max_split_size_mb:64")
    assert expandable.expandable_segments and parse_alloc_conf(to_alloc_conf(expandable)) == expandable
    assert parse_alloc_conf("expandable_segments:true").expandable_segments  # spelled as torch's docs do
    assert expandable.to_settings()["expandable_segments"] is True


def test_oom_numbers_parse_a_real_message():
    real = (
        "CUDA out of memory. Tried to allocate 204.00 MiB. GPU 0 has a total capacity of 47.53 GiB of "
        "which 94.88 MiB is free. Process 1381433 has 47.43 GiB memory in use. Of the allocated memory "
        "47.03 GiB is allocated by PyTorch, and 83.38 MiB is reserved by PyTorch but unallocated. If ..."
    )
    assert oom_numbers(real) == {"tried": "204.00 MiB", "allocated": "47.03 GiB", "unallocated": "83.38 MiB"}


def test_gpu_entry_points_fail_clearly_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("has CUDA")
    with pytest.raises(RuntimeError, match="CUDA"):
        record_trace_on_gpu()
    with pytest.raises(RuntimeError, match="CUDA"):
        replay_on_gpu([])
    with pytest.raises(ValueError, match="not live"):
        replay_on_gpu([("free", 1)])
    with pytest.raises(ValueError, match="replay_on_gpu"):
        compare_replay([], {"streams": {}})


# ---- GPU: the fidelity claims ------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("workload", ["mlp_two_streams", "convnet_varied_shapes"])
def test_model_reproduces_real_allocator_every_step(workload):
    recording = record_trace_on_gpu(workload, steps=6)
    report = compare_fidelity(recording)
    assert report["exact_match_steps"] == report["steps"], json.dumps(report["rows"], indent=1)
    assert report["final_state_matches"], "same stats, but the final block layout differs"


@pytest.mark.gpu
def test_predicted_peak_reserved_matches_gpu():
    """Exercise (f) on the GPU: the model's peak of the recorded trace is max_memory_reserved()."""
    recording = record_trace_on_gpu("mlp_two_streams", steps=4)
    imported = trace_from_device_trace(
        recording["device_trace"], initial_segments=recording["initial_segments"]
    )
    result = imported.replay()
    assert result.peak_reserved == recording["steps"][-1]["peak_reserved"]
    if not recording["initial_segments"]:
        assert predict_peak_reserved(imported.trace) == recording["steps"][-1]["peak_reserved"]


@pytest.mark.gpu
def test_fragmenting_trace_ooms_at_the_same_event_on_gpu():
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = FRAGMENTATION_CAPACITY / total
    trace = fragmenting_trace()
    gpu = replay_on_gpu(trace, memory_fraction=fraction)
    report = compare_replay(trace, gpu, memory_fraction=fraction)
    assert report["real_oom"] is not None and report["real_oom"] == report["model_oom"], report
    assert report["exact_match_events"] == report["compared"] and report["oom_numbers_match"], report


@pytest.mark.gpu
def test_random_trace_replays_identically_on_gpu():
    trace = random_trace(1500, seed=3, empty_cache_every=300, cross_stream_uses=False)
    gpu = replay_on_gpu(trace)
    report = compare_replay(trace, gpu)
    assert report["exact_match_events"] == report["compared"] == len(trace), report


def test_capacity_of_gpu_tests_is_sane():
    assert FRAGMENTATION_CAPACITY == 1 * GiB


@pytest.mark.parametrize("seed", range(6))
def test_random_model_recordings_replay_exactly(seed):
    """Importer + replay reproduce every step of random multi-stream programs (record_stream, sync,
    empty_cache), including an allocator that was not empty when recording started."""
    trace = random_trace(480, seed=seed, streams=(0, S1, S1 + 256), empty_cache_every=97)
    prelude, rest = trace[:80], trace[80:]
    steps = [rest[i : i + 50] for i in range(0, len(rest), 50)]
    # ids freed in a later chunk stay live across step boundaries: fake_recording carries them
    recording, _ = fake_recording(prelude, steps, capacity=1 << 40)
    report = compare_fidelity(recording)
    assert report["exact_match_steps"] == report["steps"], report["rows"]
    assert report["alloc_address_mismatches"] == 0


def test_replay_snapshot_reaches_the_final_state():
    from ptinternals.allocator import CachingAllocator, replay
    from ptinternals.allocator.importer import replay_snapshot

    gpu = CachingAllocator(1 << 40)  # plays the GPU: its snapshot is what _dump_snapshot would save
    replay(random_trace(400, seed=11, streams=(0, S1), empty_cache_every=90), allocator=gpu)
    snap = json.loads(json.dumps(gpu.snapshot()))  # as if loaded from disk
    report = replay_snapshot(snap)
    assert report["final_state_matches"], report["mismatched_segments"][:3]
    with pytest.raises(IndexError, match="device 3"):
        replay_snapshot(snap, device=3)
    with pytest.raises(ValueError, match="device_traces"):
        replay_snapshot({"segments": []})


def test_record_trace_on_gpu_code_path_with_a_fake_cuda(monkeypatch):
    """Drive record_trace_on_gpu against a fake torch.cuda backed by the model allocator, so the
    recorder's own code (history on/off, step boundaries, stats keys) runs without a GPU."""
    from ptinternals.allocator import CachingAllocator, replay

    gpu = CachingAllocator(80 * GiB)
    replay([("alloc", "old", 5 * MiB, 0)], allocator=gpu)  # something already allocated
    history = {"on": False, "start": 0}

    def record(enabled="all", **kw):
        history["on"] = enabled is not None
        if not history["on"]:
            gpu.device_trace.clear()

    def snapshot():
        s = gpu.snapshot()
        if not history["on"]:
            s["device_traces"] = [[]]
        return s

    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda device=None: gpu.reset_peak_stats())
    monkeypatch.setattr(
        cuda, "mem_get_info", lambda device=None: (gpu.device.free_bytes, gpu.device.capacity)
    )
    monkeypatch.setattr(cuda, "memory_stats", lambda device=None: gpu.memory_stats())
    monkeypatch.setattr(cuda, "get_device_name", lambda device=None: "fake")
    monkeypatch.setattr(cuda.memory, "_snapshot", snapshot)
    monkeypatch.setattr(cuda.memory, "_record_memory_history", record)
    gpu.device_trace.clear()

    def workload(step, state):
        live = state.setdefault("live", {})
        for ev in _steps()[step % 4]:
            live_ids = {b.handle: b for b in gpu.active_blocks if b.allocated}
            replay([ev], allocator=gpu, live=live_ids)
        assert isinstance(live, dict)

    recording = record_trace_on_gpu(workload, steps=4)
    assert len(recording["initial_segments"]) == 1 and recording["workload"] == "workload"
    json.loads(json.dumps(recording))
    report = compare_fidelity(recording)
    assert report["exact_match_steps"] == 4 and report["final_state_matches"], report["rows"]
