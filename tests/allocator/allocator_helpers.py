"""Helpers for the allocator tests: a 'GPU' made of the model itself, for CPU-side pipeline checks."""

from __future__ import annotations

from ptinternals.allocator import CachingAllocator, GiB, parse_alloc_conf
from ptinternals.allocator.recorder import RECORDING_FORMAT
from ptinternals.allocator.trace import replay


def fake_recording(
    prelude: list, steps: list[list], *, capacity: int = 8 * GiB, alloc_conf: str = ""
) -> tuple[dict, CachingAllocator]:
    """Run ``prelude`` (before recording starts), then each step's events, in a model allocator, and
    package what a GPU run would give: a recording in the format of ``record_trace_on_gpu``."""
    alloc = CachingAllocator(capacity, config=parse_alloc_conf(alloc_conf))
    replay(prelude, allocator=alloc)
    alloc.reset_peak_stats()
    initial = alloc.snapshot()["segments"]
    alloc.device_trace.clear()
    free_at_start = alloc.device.free_bytes
    rows = []
    for k, events in enumerate(steps):
        live = {b.handle: b for b in alloc.active_blocks if b.allocated}  # ids set by replay()
        replay(events, allocator=alloc, live=live)
        stats = alloc.memory_stats()
        rows.append(
            {
                "step": k,
                "trace_index": len(alloc.device_trace),
                "reserved_bytes": stats["reserved_bytes.all.current"],
                "allocated_bytes": stats["allocated_bytes.all.current"],
                "segments": stats["segment.all.current"],
                "peak_reserved": stats["reserved_bytes.all.peak"],
            }
        )
    recording = {
        "format": RECORDING_FORMAT,
        "workload": "fake",
        "torch_version": "model",
        "device_name": "model",
        "total_memory": capacity,
        "free_at_start": free_at_start,
        "alloc_conf": alloc_conf,
        "allocator_settings": None,
        "initial_segments": initial,
        "device_trace": [dict(e) for e in alloc.device_trace],
        "final_segments": alloc.snapshot()["segments"],
        "steps": rows,
    }
    return recording, alloc
