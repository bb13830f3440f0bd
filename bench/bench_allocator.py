"""Benchmarks for the allocator chapter (the caching allocator model): replay speed and fidelity to the real allocator.

- Replay speed of the model (events per second) on a synthetic random workload, the synthetic
  training steps and every committed recording in ``src/ptinternals/allocator/traces/*.json``.
  The model is host code, so it is always timed on the CPU; on CUDA, ``torch_ms`` is the real
  caching allocator running the same alloc/free sequence (``torch.empty`` / ``del``, host time).
  ``bytes_moved`` is the bytes handed out by the replayed allocations (so GB/s reads as
  "allocator throughput"), not memory traffic.
- Fidelity, on CUDA only: ``record_trace_on_gpu`` runs real training steps, ``compare_fidelity``
  replays them in the model; ``extra`` carries {'steps', 'exact_match_steps', ...}. The
  fragmenting trace is also run on the GPU (under a memory fraction) to compare the OOM point.
"""

from __future__ import annotations

import glob
import json
import os

from ptinternals.allocator import replay
from ptinternals.allocator.importer import trace_from_device_trace
from ptinternals.allocator.recorder import (
    WORKLOADS,
    compare_fidelity,
    compare_replay,
    record_trace_on_gpu,
    replay_on_gpu,
)
from ptinternals.allocator.workloads import (
    FRAGMENTATION_CAPACITY,
    fragmenting_trace,
    random_trace,
    training_step_trace,
)
from ptinternals.benchmark import Measurement, time_ms

TRACES_DIR = os.path.join(os.path.dirname(__file__), "..", "src", "ptinternals", "allocator", "traces")
_CAPACITY = 1 << 40  # 1 TiB: replays for speed never run out of memory


def _bytes_allocated(trace) -> int:
    return sum(ev[2] for ev in trace if ev[0] == "alloc")


def _real_allocator_ms(trace, device: str) -> float | None:
    """Host time of the real caching allocator doing the trace's allocations and frees."""
    if device != "cuda":
        return None
    import torch

    dev = torch.device("cuda")
    streams: dict = {0: torch.cuda.current_stream()}

    def run():
        live = {}
        for ev in trace:
            if ev[0] == "alloc":
                s = streams.setdefault(ev[3], torch.cuda.Stream())
                with torch.cuda.stream(s):
                    live[ev[1]] = torch.empty(ev[2], dtype=torch.uint8, device=dev)
            elif ev[0] == "free":
                del live[ev[1]]
        live.clear()

    return time_ms(run, "cpu", warmup=1, reps=5)


def _speed(name: str, trace, device: str, extra: dict | None = None) -> Measurement:
    ms = time_ms(lambda: replay(trace, _CAPACITY), "cpu", warmup=1, reps=3)
    events = len(trace)
    return Measurement(
        suite="allocator",
        name=name,
        device="cpu",
        shape=f"{events} events",
        dtype="-",
        ms=ms,
        bytes_moved=_bytes_allocated(trace),
        torch_ms=_real_allocator_ms([e for e in trace if e[0] in ("alloc", "free")], device),
        extra={"events": events, "events_per_s": events / (ms * 1e-3), **(extra or {})},
    )


def run(ctx) -> list[Measurement]:
    device = getattr(ctx, "device", "cpu")
    small = getattr(ctx, "small", True)
    out: list[Measurement] = []
    n = 2_000 if small else 200_000
    # at most 256 live tensors (avg ~10 MiB): a few GiB, so the real allocator can run it too
    workload = random_trace(n, seed=0, empty_cache_every=n // 4, max_live=256)
    out.append(_speed("replay_random", workload, device))
    out.append(_speed("replay_training_steps", training_step_trace(steps=3 if small else 50), device))

    frag = fragmenting_trace()
    r = replay(frag, FRAGMENTATION_CAPACITY)
    out.append(
        Measurement(
            suite="allocator",
            name="fragmenting_oom",
            device="cpu",
            shape=f"{len(frag)} events",
            dtype="-",
            ms=time_ms(lambda: replay(frag, FRAGMENTATION_CAPACITY), "cpu", warmup=1, reps=3),
            bytes_moved=_bytes_allocated(frag),
            extra={
                "oom_event": r.oom and r.oom["event_index"],
                "reserved_unallocated_at_oom": r.oom and r.oom["reserved_bytes"] - r.oom["allocated_bytes"],
            },
        )
    )

    for path in sorted(glob.glob(os.path.join(TRACES_DIR, "*.json"))):  # committed GPU recordings
        with open(path) as f:
            recording = json.load(f)
        report = compare_fidelity(recording)
        trace = trace_from_device_trace(
            recording["device_trace"], initial_segments=recording["initial_segments"]
        ).trace
        m = _speed(
            f"replay_recorded_{os.path.splitext(os.path.basename(path))[0]}",
            trace,
            device,
            {
                "steps": report["steps"],
                "exact_match_steps": report["exact_match_steps"],
                "recorded_with": recording.get("torch_version"),
            },
        )
        out.append(m)

    if device == "cuda":
        steps = 3 if small else 8
        for name in sorted(WORKLOADS):
            recording = record_trace_on_gpu(name, steps=steps)
            report = compare_fidelity(recording)
            imported = trace_from_device_trace(
                recording["device_trace"], initial_segments=recording["initial_segments"]
            )
            ms = time_ms(lambda imported=imported: imported.replay(), "cpu", warmup=1, reps=3)
            out.append(
                Measurement(
                    suite="allocator",
                    name=f"fidelity_{name}",
                    device="cuda",
                    shape=f"{steps} steps",
                    dtype="-",
                    ms=ms,
                    bytes_moved=_bytes_allocated(imported.trace),
                    extra={
                        "steps": report["steps"],
                        "exact_match_steps": report["exact_match_steps"],
                        "first_mismatch": report["first_mismatch"],
                        "events": len(imported.trace),
                        "alloc_address_mismatches": report["alloc_address_mismatches"],
                    },
                )
            )
        import torch

        fraction = FRAGMENTATION_CAPACITY / torch.cuda.get_device_properties(0).total_memory
        gpu = replay_on_gpu(frag, memory_fraction=fraction)
        rep = compare_replay(frag, gpu, memory_fraction=fraction)
        out.append(
            Measurement(
                suite="allocator",
                name="fidelity_fragmenting_oom",
                device="cuda",
                shape=f"{len(frag)} events",
                dtype="-",
                ms=time_ms(lambda: replay(frag, FRAGMENTATION_CAPACITY), "cpu", warmup=1, reps=3),
                bytes_moved=_bytes_allocated(frag),
                extra=rep,
            )
        )
    return out


if __name__ == "__main__":
    from types import SimpleNamespace

    from ptinternals.device import pick_device

    dev = pick_device()
    for m in run(SimpleNamespace(device=dev, small=dev != "cuda", peaks=None)):
        print(json.dumps(m.to_dict(), default=str))
