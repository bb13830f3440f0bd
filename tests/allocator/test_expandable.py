"""Expandable segments in the model (issue 17): pages mapped at the end of one growing segment, the split
rule of the large pool, unmapping on empty_cache, the snapshot and device trace they leave, the
fragmenting trace fixed by them; recordings with segment_map/segment_unmap replayed (and, on a GPU,
compared with the real allocator)."""

import json
import os
import subprocess
import sys

import pytest
from torch.cuda import _memory_viz

from ptinternals.allocator import CachingAllocator, DeviceMemory, GiB, MiB, parse_alloc_conf
from ptinternals.allocator.allocator import OutOfMemoryError
from ptinternals.allocator.importer import trace_from_device_trace
from ptinternals.allocator.recorder import compare_fidelity
from ptinternals.allocator.trace import replay
from ptinternals.allocator.workloads import (
    FRAGMENTATION_CAPACITY,
    fragmentation_numbers,
    fragmenting_trace,
    random_trace,
)

from .allocator_helpers import fake_recording

EXPANDABLE = parse_alloc_conf("expandable_segments:True")


def expandable(capacity=8 * GiB):
    return CachingAllocator(capacity, config=EXPANDABLE)


def layout(a):
    """Each mapped range as (total size, [(block size, state), ...]), and whether it is expandable."""
    return [(s["total_size"], [(b["size"], b["state"]) for b in s["blocks"]], s["is_expandable"])
            for s in a.snapshot()["segments"]]


def actions(a):
    return [(e["action"], e["size"]) for e in a.device_trace if e["action"].startswith("segment")]


def test_a_request_maps_pages_and_the_next_one_grows_into_the_free_tail():
    a = expandable()
    x = a.malloc(3 * MiB)  # one 20 MiB page of the large pool; the 17 MiB tail is split off
    assert layout(a) == [(20 * MiB, [(3 * MiB, "active_allocated"), (17 * MiB, "inactive")], True)]
    assert a.memory_reserved() == 20 * MiB and a.memory_stats()["num_device_alloc"] == 1
    assert a.num_segments() == 0  # a mapped page is not a cudaMalloc'd segment: the stat does not count it
    y = a.malloc(30 * MiB)  # the 17 MiB tail + one more page, merged: a cudaMalloc'd allocator needs 30 MiB more
    assert layout(a) == [(40 * MiB, [(3 * MiB, "active_allocated"), (30 * MiB, "active_allocated"),
                                     (7 * MiB, "inactive")], True)]
    assert actions(a) == [("segment_map", 20 * MiB), ("segment_map", 20 * MiB)]
    assert y.ptr == x.ptr + 3 * MiB
    assert a.memory_stats()["inactive_split_bytes.all.current"] == 0  # expandable blocks never count there
    a.free(x)
    a.free(y)
    a.empty_cache()  # one free block of two pages: unmapped, and the address range goes back
    assert a.memory_reserved() == 0 and a.device.used == 0 and not a.expandable_segments and not a.device._live
    assert actions(a)[-1] == ("segment_unmap", 40 * MiB)
    a.check_invariants()


def test_the_small_pool_maps_2_mib_pages_in_a_segment_of_its_own():
    a = expandable()
    a.malloc(1000)
    a.malloc(3 * MiB)
    assert sorted(layout(a)) == [(2 * MiB, [(1024, "active_allocated"), (2 * MiB - 1024, "inactive")], True),
                                 (20 * MiB, [(3 * MiB, "active_allocated"), (17 * MiB, "inactive")], True)]
    assert len(a.expandable_segments) == 2


def test_the_large_pool_splits_any_tail_of_512_bytes_or_more():
    """should_split with expandable segments: remaining >= kMinBlockSize in both pools."""
    plain, grown = CachingAllocator(8 * GiB), expandable()
    for alloc in (plain, grown):
        alloc.malloc(19 * MiB + 512)  # a 20 MiB segment (or page) with a tail of 1 MiB - 512 B
    assert plain.memory_allocated() == 20 * MiB  # the tail is not MORE than 1 MiB: it stays in the block
    assert grown.memory_allocated() == 19 * MiB + 512  # split off, free for the next request
    base = grown.expandable_segments[0].ptr
    assert grown.malloc(10 * MiB).ptr == base + 19 * MiB + 512  # the tail, grown by the next page
    assert grown.memory_reserved() == 40 * MiB


def test_empty_cache_unmaps_whole_pages_under_free_blocks_anywhere():
    a = expandable()
    x = a.malloc(25 * MiB)  # pages [0, 20) and [20, 40) MiB; x = [0, 25)
    a.malloc(15 * MiB)  # [25, 40): the tail exactly
    a.free(x)
    a.empty_cache()  # page [0, 20) lies under the free block: unmapped; [20, 25) is half a page: stays
    assert a.memory_reserved() == 20 * MiB
    assert layout(a) == [(20 * MiB, [(5 * MiB, "inactive"), (15 * MiB, "active_allocated")], True)]
    assert actions(a)[-1] == ("segment_unmap", 20 * MiB)
    assert a.snapshot()["segments"][0]["address"] == a.expandable_segments[0].ptr + 20 * MiB
    z = a.malloc(18 * MiB)  # the lowest address with room: the unmapped first page, remapped
    assert z.ptr == a.expandable_segments[0].ptr and a.memory_reserved() == 40 * MiB
    a.check_invariants()


def test_best_fit_prefers_a_block_that_cannot_grow():
    """get_free_block: among expandable blocks big enough, one with less unmapped room after it wins."""
    a = expandable()
    a.malloc(2 * MiB)  # [0, 2) of the first 20 MiB page
    b = a.malloc(9 * MiB)  # [2, 11)
    a.malloc(5 * MiB)  # [11, 16): the free tail [16, 20) is 4 MiB, next to the unmapped rest of the segment
    hole = b.ptr
    a.free(b)  # a 9 MiB hole between two live blocks: it cannot grow
    c = a.malloc(3 * MiB)  # the 4 MiB tail is the smaller fit, but it counts as all the room it can grow into
    assert c.ptr == hole
    a.check_invariants()


def test_out_of_memory_maps_nothing_and_the_retry_unmaps_the_cache():
    a = expandable(100 * MiB)  # five 20 MiB pages
    keep = a.malloc(30 * MiB)  # pages 0-1
    tmp = a.malloc(45 * MiB)  # [30, 75): pages 2-3
    a.free(tmp)
    big = a.malloc(60 * MiB)  # [30, 90): needs page 4 only
    assert a.memory_reserved() == 100 * MiB
    a.free(big)
    with pytest.raises(OutOfMemoryError, match="Tried to allocate"):
        a.malloc(90 * MiB)  # 30 + 90 > 100 MiB: the retry unmaps free pages, still no room
    assert a.memory_stats()["num_alloc_retries"] == 1
    assert a.memory_reserved() == 40 * MiB  # pages 0-1 hold keep; [30, 40) is half a page: kept mapped
    a.free(keep)
    a.check_invariants()


def test_the_fragmenting_trace_fits_with_expandable_segments():
    """The numbers the notebook prints (at the OOM, or at the end)."""
    plain = fragmentation_numbers(fragmenting_trace(), FRAGMENTATION_CAPACITY)
    grown = fragmentation_numbers(fragmenting_trace(), FRAGMENTATION_CAPACITY, config=EXPANDABLE)
    failing = fragmenting_trace()[plain["oom_event"]]
    assert failing[:2] == ("alloc", "keep10") and plain["largest_free"] < failing[2]  # the OOM of the chapter
    assert plain["reserved"] - plain["allocated"] > failing[2]  # ... with enough memory free in pieces
    assert plain == {"oom_event": 41, "reserved": 984 * MiB, "allocated": 664 * MiB, "peak_reserved": 984 * MiB,
                     "segments": 11, "largest_free": 54 * MiB}
    assert grown == {"oom_event": None, "reserved": 960 * MiB, "allocated": 594 * MiB, "peak_reserved": 960 * MiB,
                     "segments": 1, "largest_free": 144 * MiB}
    assert grown["allocated"] == sum(e[2] for e in fragmenting_trace() if e[0] == "alloc" and e[1].startswith("keep"))


def test_the_snapshot_reads_in_torchs_memory_viz():
    r = replay(fragmenting_trace(), FRAGMENTATION_CAPACITY, config=EXPANDABLE)
    snap = r.allocator.snapshot()
    assert snap["allocator_settings"]["expandable_segments"] is True
    assert [s["is_expandable"] for s in snap["segments"]] == [True]
    kinds = {e["action"] for e in snap["device_traces"][0]}
    assert {"segment_map", "alloc", "free_completed"} <= kinds and "segment_alloc" not in kinds
    assert "960.0MiB" in _memory_viz.segsum(snap).replace(" ", "")
    assert len(_memory_viz.trace_plot(snap)) > 1000


def test_invariants_hold_through_random_traces_with_ooms():
    ooms = 0
    for seed in range(12):
        a = expandable((150 + 25 * seed) * MiB)
        blocks = {}
        for ev in random_trace(250, seed=seed, max_size=48 * MiB, empty_cache_every=41 if seed % 2 else 0):
            try:
                if ev[0] == "alloc":
                    blocks[ev[1]] = a.malloc(ev[2], ev[3])
                elif ev[0] == "free":
                    a.free(blocks.pop(ev[1]))
                elif ev[0] == "record_stream":
                    a.record_stream(blocks[ev[1]], ev[2])
                elif ev[0] == "sync":
                    a.sync(ev[1])
                elif ev[0] == "empty_cache":
                    a.empty_cache()
            except OutOfMemoryError:
                blocks[ev[1]] = None
                ooms += 1
            a.check_invariants()
        for b in blocks.values():
            a.free(b)
        a.sync(0), a.sync(1), a.empty_cache()
        assert a.memory_reserved() == a.device.used == 0 and not a.expandable_segments
    assert ooms > 10  # the out-of-memory paths ran


def test_device_memory_reservations():
    d = DeviceMemory(100 * MiB)
    r = d.reserve(1 * GiB)  # addresses only: far more than the memory
    assert d.used == 0 and d.create(60 * MiB) and not d.create(60 * MiB) and d.used == 60 * MiB
    assert d.malloc(20 * MiB) >= r + 1 * GiB  # cudaMalloc'd memory lands outside the reserved range
    with pytest.raises(ValueError, match="not a live segment"):
        d.free(r)
    d.release(60 * MiB)
    d.release_reservation(r)
    for bad in (lambda: d.reserve(0), lambda: d.create(-1), lambda: d.release(10 * GiB),
                lambda: d.release_reservation(r)):
        with pytest.raises(ValueError):
            bad()


def test_recorded_segment_maps_and_unmaps_translate_and_replay():
    base = 0x7F3A00000000
    entries = [
        {"action": "segment_map", "addr": base, "size": 20 * MiB, "stream": 0},
        {"action": "alloc", "addr": base, "size": 3 * MiB, "stream": 0},
        {"action": "free_requested", "addr": base, "size": 3 * MiB, "stream": 0},
        {"action": "free_completed", "addr": base, "size": 3 * MiB, "stream": 0},
        {"action": "segment_unmap", "addr": base, "size": 20 * MiB, "stream": 0},
    ]
    imp = trace_from_device_trace(entries)
    assert imp.trace == [("alloc", 0, 3 * MiB, 0), ("free", 0), ("empty_cache",)]
    assert imp.segment_maps == [(base, 20 * MiB)]
    r = imp.replay(8 * GiB, config=EXPANDABLE)
    assert r.alloc_ptrs == [base] and r.reserved_bytes == [20 * MiB, 20 * MiB, 0]


def test_compare_fidelity_on_an_expandable_model_recording():
    steps = []
    for k in range(4):
        n = (3, 5, 2, 7)[k]
        ev = [("alloc", f"h{k}_{i}", (i + 1) * n * 300_000, 0) for i in range(6)]
        ev += [("free", f"h{k}_{i}") for i in (4, 1, 5, 0, 3, 2)]
        ev += [("alloc", f"big{k}", (30 + 4 * k) * MiB, 0), ("free", f"big{k}")]
        ev += [("empty_cache",)] if k == 2 else []
        steps.append(ev)
    recording, gpu = fake_recording([], steps, alloc_conf="expandable_segments:True")
    assert {e["action"] for e in recording["device_trace"]} >= {"segment_map", "segment_unmap"}
    report = compare_fidelity(recording)
    assert report["exact_match_steps"] == report["steps"] == 4, report["rows"]
    assert report["final_state_matches"] and report["alloc_address_mismatches"] == 0


# ---- GPU: the real allocator with expandable segments -----------------------------------------------
_PROBE = r"""
import json, torch
from ptinternals.allocator import parse_alloc_conf
from ptinternals.allocator.recorder import compare_fidelity, compare_replay, record_trace_on_gpu, replay_on_gpu
from ptinternals.allocator.workloads import FRAGMENTATION_CAPACITY, fragmenting_trace
rec = record_trace_on_gpu("mlp_two_streams", steps=4)
fid = compare_fidelity(rec)
fraction = FRAGMENTATION_CAPACITY / torch.cuda.get_device_properties(0).total_memory
gpu = replay_on_gpu(fragmenting_trace(), memory_fraction=fraction)
rep = compare_replay(fragmenting_trace(), gpu, config=parse_alloc_conf("expandable_segments:True"),
                     memory_fraction=fraction)
print(json.dumps({"actions": sorted({e["action"] for e in rec["device_trace"]}), "conf": rec["alloc_conf"],
                  "fidelity": {k: fid[k] for k in ("steps", "exact_match_steps", "final_state_matches", "rows")},
                  "replay": rep}, default=str))
"""


@pytest.mark.gpu
def test_expandable_segments_match_the_real_allocator():
    """A real recording with expandable_segments:True, replayed by the model step by step, and the
    fragmenting trace replayed on the real allocator under a 1 GiB memory fraction, event by event."""
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["conf"] == "expandable_segments:True" and "segment_map" in out["actions"], out["actions"]
    fid = out["fidelity"]
    assert fid["exact_match_steps"] == fid["steps"] and fid["final_state_matches"], json.dumps(fid["rows"])
    rep = out["replay"]
    assert rep["real_oom"] is None and rep["model_oom"] is None, rep
    assert rep["exact_match_events"] == rep["compared"], rep
