"""Record the real allocator on a GPU, and check that the model reproduces it step by step.

Two checks of fidelity, both run by ``python -m ptinternals.allocator.recorder`` on a GPU machine:

1. ``record_trace_on_gpu(workload)`` runs a few training steps of a real model (varied batch
   shapes, a second CUDA stream with ``record_stream``) under
   ``torch.cuda.memory._record_memory_history``, and keeps the allocator's history plus the real
   ``memory_reserved()`` and segment count at the end of every step. ``compare_fidelity``
   translates the history into a model trace (``importer``), replays it, and compares the model's
   reserved bytes and segment count with the GPU's at every step. The claim: they match exactly.
2. ``replay_on_gpu(trace)`` does the opposite: it replays a model trace (e.g. the fragmenting
   one, under ``set_per_process_memory_fraction``) on the real allocator with uint8 tensors, and
   ``compare_replay`` checks the per-event reserved bytes, segment counts and the OOM point.
   Traces for this check should avoid record_stream: no kernels run, so on the GPU an event on an
   idle stream completes at once, while the model waits for an explicit ("sync", s).

Both run under any ``PYTORCH_CUDA_ALLOC_CONF`` the model parses, e.g. ``--alloc-conf
expandable_segments:True``, which records ``segment_map``/``segment_unmap`` entries and checks the
model's expandable segments against the real ones (the model replays with the same settings).

Only ``torch.cuda`` APIs present since torch 2.1 are used (the GPU machine runs torch 2.11).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import sys
from collections.abc import Callable

from .allocator import CachingAllocator
from .config import DEFAULT_CONFIG, AllocatorConfig, parse_alloc_conf
from .device import DeviceMemory
from .importer import insert_step_markers, segment_layout, trace_from_device_trace
from .snapshot import restore_segments
from .trace import replay, validate_trace

RECORDING_FORMAT = "ptinternals.allocator.recording/1"


# ----------------------------------------------------------------------------------------------
# workloads: callables (step, state) -> None; state persists across steps
# ----------------------------------------------------------------------------------------------
def mlp_two_streams(step: int, state: dict) -> None:
    """An MLP training step; inputs made on a side stream, output statistics computed on it."""
    import torch
    import torch.nn.functional as F

    dev = state["device"]
    if "model" not in state:
        torch.manual_seed(0)
        state["model"] = torch.nn.Sequential(
            torch.nn.Linear(1024, 2048),
            torch.nn.GELU(),
            torch.nn.Linear(2048, 2048),
            torch.nn.GELU(),
            torch.nn.Linear(2048, 512),
        ).to(dev)  # weights: 8 MiB, 16 MiB, 4 MiB (fp32)
        state["opt"] = torch.optim.AdamW(state["model"].parameters(), lr=1e-3, foreach=True)
        state["side"] = torch.cuda.Stream(dev)
    model, opt, side = state["model"], state["opt"], state["side"]
    main = torch.cuda.current_stream(dev)
    batch = (96, 256, 160, 320, 64, 200, 288, 128)[step % 8]  # varied shapes: (B, 1024) fp32 inputs
    side.wait_stream(main)
    with torch.cuda.stream(side):  # a prefetching loader: inputs are allocated on the side stream
        x = torch.randn(batch, 1024, device=dev)
        target = torch.randn(batch, 512, device=dev)
    main.wait_stream(side)
    x.record_stream(main)
    target.record_stream(main)
    out = model(x)  # (B, 512)
    loss = F.mse_loss(out, target)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    stats_src = out.detach()
    side.wait_stream(main)
    with torch.cuda.stream(side):  # a consumer on the side stream of a main-stream tensor
        state["col_norms"] = stats_src.pow(2).mean(dim=0)
    stats_src.record_stream(side)
    del x, target, out, loss, stats_src


def convnet_varied_shapes(step: int, state: dict) -> None:
    """A small conv net (cuDNN workspaces too) on images whose size changes every step."""
    import torch
    import torch.nn.functional as F

    dev = state["device"]
    if "model" not in state:
        torch.manual_seed(0)
        state["model"] = torch.nn.Sequential(
            torch.nn.Conv2d(3, 64, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(64, 128, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(128, 10),
        ).to(dev)
        state["opt"] = torch.optim.SGD(state["model"].parameters(), lr=0.1, momentum=0.9)
    model, opt = state["model"], state["opt"]
    batch, hw = ((32, 64), (24, 96), (48, 48), (16, 128), (40, 72))[step % 5]
    x = torch.randn(batch, 3, hw, hw, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    del x, y, loss


WORKLOADS: dict[str, Callable[[int, dict], None]] = {
    "mlp_two_streams": mlp_two_streams,
    "convnet_varied_shapes": convnet_varied_shapes,
}


def _strip(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k not in ("frames", "compile_context", "user_metadata")}


def _strip_segment(seg: dict) -> dict:
    out = _strip(seg)
    out["blocks"] = [_strip(b) for b in seg["blocks"]]
    return out


def record_trace_on_gpu(
    workload: str | Callable[[int, dict], None] = "mlp_two_streams",
    *,
    steps: int = 6,
    device: int = 0,
    max_entries: int = 2_000_000,
) -> dict:
    """Run ``steps`` steps of ``workload`` on CUDA, recording the caching allocator's history.

    Returns a JSON-able recording: the starting segments (the allocator need not be empty), the
    device trace (frames dropped), and for every step the trace length and the real
    ``memory_reserved``, ``memory_allocated``, segment count and peak reserved at its end.
    """
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("record_trace_on_gpu needs a CUDA device (torch.cuda.is_available() is False)")
    fn = WORKLOADS.get(workload) if isinstance(workload, str) else workload
    if fn is None or not callable(fn):
        raise ValueError(f"workload must be a callable or one of {sorted(WORKLOADS)}, got {workload!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    mem = torch.cuda.memory
    torch.cuda.synchronize(device)
    gc.collect()
    torch.cuda.reset_peak_memory_stats(device)
    initial = mem._snapshot()
    initial_segments = [s for s in initial["segments"] if s.get("device", device) == device]
    free_at_start, total = torch.cuda.mem_get_info(device)
    mem._record_memory_history(enabled="all", context=None, stacks="python", max_entries=max_entries)
    state: dict = {"device": torch.device("cuda", device)}
    rows = []
    try:
        start = len(mem._snapshot()["device_traces"][device])  # entries left over from earlier history
        for k in range(steps):
            fn(k, state)
            n = len(mem._snapshot()["device_traces"][device]) - start
            stats = torch.cuda.memory_stats(device)
            rows.append(
                {
                    "step": k,
                    "trace_index": n,
                    "reserved_bytes": stats["reserved_bytes.all.current"],
                    "allocated_bytes": stats["allocated_bytes.all.current"],
                    "segments": stats["segment.all.current"],
                    "peak_reserved": stats["reserved_bytes.all.peak"],
                }
            )
        snap = mem._snapshot()
    finally:
        mem._record_memory_history(enabled=None)
    entries = snap["device_traces"][device][start:]
    if len(entries) + start >= max_entries:
        raise RuntimeError(f"the trace filled max_entries={max_entries}: the ring buffer wrapped; raise it")
    del state
    return {
        "format": RECORDING_FORMAT,
        "workload": workload if isinstance(workload, str) else getattr(fn, "__name__", "custom"),
        "torch_version": torch.__version__,
        "device": device,
        "device_name": torch.cuda.get_device_name(device),
        "total_memory": total,
        "free_at_start": free_at_start,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_ALLOC_CONF", "")),
        "allocator_settings": snap.get("allocator_settings"),
        "initial_segments": initial_segments,
        "device_trace": [_strip(e) for e in entries],
        "final_segments": [_strip_segment(s) for s in snap["segments"] if s.get("device", device) == device],
        "steps": rows,
    }


def config_of(recording: dict) -> AllocatorConfig:
    """The allocator settings a recording ran under (from PYTORCH_CUDA_ALLOC_CONF)."""
    conf = recording.get("alloc_conf") or ""
    return parse_alloc_conf(conf) if conf else DEFAULT_CONFIG


def compare_fidelity(recording: dict, *, config: AllocatorConfig | None = None) -> dict:
    """Replay a recording in the model; compare reserved bytes and segment count at every step.

    Returns {"steps", "exact_match_steps", "rows", "alloc_address_mismatches", "oracle_misses",
    "notes", "first_mismatch"}; ``rows`` holds real and model numbers per step.
    """
    if not isinstance(recording, dict) or recording.get("format") != RECORDING_FORMAT:
        raise ValueError(
            f"recording must be a dict made by record_trace_on_gpu (format {RECORDING_FORMAT!r})"
        )
    imported = trace_from_device_trace(
        recording["device_trace"],
        initial_segments=recording["initial_segments"],
        device=int(recording.get("device", 0)),
    )
    trace = insert_step_markers(imported, [s["trace_index"] for s in recording["steps"]])
    # the GPU as cudaMalloc saw it: what was free at the start, plus what PyTorch already held
    capacity = int(recording.get("total_memory") or 1 << 50)
    initial_reserved = sum(s["total_size"] for s in recording["initial_segments"])
    free_at_start = int(recording.get("free_at_start") or capacity - initial_reserved)
    non_pytorch = max(capacity - free_at_start - initial_reserved, 0)
    result = imported.replay(
        capacity, non_pytorch_bytes=non_pytorch, config=config or config_of(recording), trace=trace
    )
    rows, exact, first = [], 0, None
    for real, model in zip(recording["steps"], result.steps, strict=False):
        ok = real["reserved_bytes"] == model["reserved_bytes"] and real["segments"] == model["segments"]
        exact += ok
        rows.append(
            {
                "step": real["step"],
                "match": ok,
                "real_reserved": real["reserved_bytes"],
                "model_reserved": model["reserved_bytes"],
                "real_segments": real["segments"],
                "model_segments": model["segments"],
                "real_allocated": real["allocated_bytes"],
                "model_allocated": model["allocated_bytes"],
            }
        )
        if not ok and first is None:
            first = real["step"]
    final_ok = None
    if "final_segments" in recording:  # block by block, the layout the GPU ended with
        model_layout = segment_layout(result.allocator.snapshot()["segments"])
        final_ok = model_layout == segment_layout(recording["final_segments"])
    mismatched_addrs = sum(1 for a, b in zip(imported.alloc_addrs, result.alloc_ptrs, strict=False) if a != b)
    return {
        "workload": recording.get("workload"),
        "steps": len(recording["steps"]),
        "exact_match_steps": exact,
        "first_mismatch": first,
        "rows": rows,
        "alloc_address_mismatches": mismatched_addrs,
        "oracle_misses": len(result.allocator.device.oracle_misses),
        "notes": imported.notes,
        "model_oom": result.oom,
        "final_state_matches": final_ok,
    }


# ----------------------------------------------------------------------------------------------
# the other direction: a model trace on the real allocator
# ----------------------------------------------------------------------------------------------
def replay_on_gpu(trace: list, *, device: int = 0, memory_fraction: float | None = None) -> dict:
    """Replay a model trace on the real caching allocator with ``torch.empty(n, dtype=uint8)``.

    Model stream 0 is the default stream; other stream numbers get a ``torch.cuda.Stream`` each.
    Returns the per-event real reserved bytes, allocated bytes and segment counts, the OOM (event
    index and message) if any, the starting segments and the real stream handles used.
    """
    import torch

    trace = validate_trace(trace)
    if not torch.cuda.is_available():
        raise RuntimeError("replay_on_gpu needs a CUDA device")
    dev = torch.device("cuda", device)
    torch.cuda.synchronize(device)
    gc.collect()
    torch.cuda.empty_cache()
    old_fraction = (
        torch.cuda.get_per_process_memory_fraction(device)
        if hasattr(torch.cuda, "get_per_process_memory_fraction")
        else 1.0
    )
    streams: dict[int, object] = {0: torch.cuda.default_stream(device)}
    tensors: dict = {}
    out = {"reserved_bytes": [], "allocated_bytes": [], "segments": [], "oom": None}
    initial = torch.cuda.memory._snapshot()
    out["initial_segments"] = [s for s in initial["segments"] if s.get("device", device) == device]
    out["total_memory"] = torch.cuda.get_device_properties(device).total_memory
    try:
        if memory_fraction is not None:
            torch.cuda.set_per_process_memory_fraction(memory_fraction, device)
        for i, ev in enumerate(trace):
            kind = ev[0]
            if kind in ("alloc", "record_stream", "sync"):
                s = ev[-1] if kind != "sync" else ev[1]
                if s not in streams:
                    streams[s] = torch.cuda.Stream(device)
            if kind == "alloc":
                with torch.cuda.stream(streams[ev[3]]):
                    try:
                        tensors[ev[1]] = torch.empty(ev[2], dtype=torch.uint8, device=dev)
                    except torch.OutOfMemoryError as e:
                        out["oom"] = {"event_index": i, "message": str(e)}
                        break
            elif kind == "free":
                del tensors[ev[1]]
            elif kind == "record_stream":
                tensors[ev[1]].record_stream(streams[ev[2]])
            elif kind == "sync":
                streams[ev[1]].synchronize()
            elif kind == "empty_cache":
                torch.cuda.empty_cache()
            stats = torch.cuda.memory_stats(device)
            out["reserved_bytes"].append(stats["reserved_bytes.all.current"])
            out["allocated_bytes"].append(stats["allocated_bytes.all.current"])
            out["segments"].append(stats["segment.all.current"])
    finally:
        tensors.clear()
        torch.cuda.synchronize(device)
        torch.cuda.set_per_process_memory_fraction(old_fraction, device)
        torch.cuda.empty_cache()
    out["streams"] = {s: int(st.cuda_stream) for s, st in streams.items()}
    return out


_OOM_NUMBERS = re.compile(
    r"Tried to allocate (?P<tried>[\d.]+ \w+)\..*?Of the allocated memory (?P<allocated>[\d.]+ \w+) is "
    r"allocated by PyTorch, and (?P<unallocated>[\d.]+ \w+) is reserved",
    re.S,
)


def oom_numbers(message: str) -> dict | None:
    """The allocator numbers of an OOM message: tried to allocate, allocated, reserved-unallocated."""
    m = _OOM_NUMBERS.search(message or "")
    return None if m is None else m.groupdict()


def compare_replay(
    trace: list, gpu: dict, *, config: AllocatorConfig | None = None, memory_fraction: float | None = None
) -> dict:
    """Replay ``trace`` in the model, as ``replay_on_gpu`` ran it, and compare event by event."""
    trace = validate_trace(trace)
    missing = [
        k
        for k in ("streams", "total_memory", "initial_segments", "reserved_bytes", "segments", "oom")
        if not isinstance(gpu, dict) or k not in gpu
    ]
    if missing:
        raise ValueError(f"gpu must be the dict returned by replay_on_gpu; missing {missing}")
    mapped = []
    for ev in trace:  # use the real stream handles, so the model orders streams like the GPU
        ev = tuple(ev)
        if ev[0] == "alloc":
            ev = ev[:3] + (gpu["streams"][ev[3]],)
        elif ev[0] in ("record_stream", "sync"):
            ev = ev[:-1] + (gpu["streams"][ev[-1]],)
        mapped.append(ev)
    device = DeviceMemory(max(int(gpu["total_memory"]), 1))
    allocator = CachingAllocator(config=config, device=device, memory_fraction=memory_fraction)
    restore_segments(allocator, gpu["initial_segments"])
    model = replay(mapped, allocator=allocator)
    n = min(len(model.reserved_bytes), len(gpu["reserved_bytes"]))
    exact = sum(
        1
        for i in range(n)
        if model.reserved_bytes[i] == gpu["reserved_bytes"][i] and model.segments[i] == gpu["segments"][i]
    )
    first = next(
        (
            i
            for i in range(n)
            if model.reserved_bytes[i] != gpu["reserved_bytes"][i] or model.segments[i] != gpu["segments"][i]
        ),
        None,
    )
    real_oom = gpu["oom"]["event_index"] if gpu["oom"] else None
    model_oom = model.oom["event_index"] if model.oom else None
    return {
        "events": len(trace),
        "compared": n,
        "exact_match_events": exact,
        "first_mismatch": first,
        "real_oom": real_oom,
        "model_oom": model_oom,
        "oom_numbers_match": (oom_numbers(gpu["oom"]["message"]) == oom_numbers(model.oom["message"]))
        if gpu["oom"] and model.oom
        else (gpu["oom"] is None and model.oom is None),
    }


def main(argv: list[str] | None = None) -> int:
    """GPU check: record workloads, compare with the model, replay synthetic traces on the GPU."""
    from .workloads import FRAGMENTATION_CAPACITY, fragmenting_trace, random_trace

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--out", default=None, help="directory for recordings (JSON) and the summary")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--workloads", nargs="*", default=sorted(WORKLOADS))
    p.add_argument("--alloc-conf", default=None,
                   help="PYTORCH_CUDA_ALLOC_CONF for this run, e.g. expandable_segments:True (set before CUDA starts)")
    args = p.parse_args(argv)
    config = DEFAULT_CONFIG
    if args.alloc_conf is not None:
        config = parse_alloc_conf(args.alloc_conf)  # a setting the model cannot replay fails here, not later
        if "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized():
            raise RuntimeError("--alloc-conf must be set before CUDA starts: run the recorder in a fresh process")
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = args.alloc_conf
    import torch

    summary: dict = {"torch": torch.__version__, "alloc_conf": args.alloc_conf or "", "recordings": [], "replays": []}
    ok = True
    for name in args.workloads:
        rec = record_trace_on_gpu(name, steps=args.steps)
        rep = compare_fidelity(rec)
        ok &= rep["exact_match_steps"] == rep["steps"]
        summary["recordings"].append(
            {k: v for k, v in rep.items() if k != "notes"} | {"notes": rep["notes"][:5]}
        )
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, f"{name}.json"), "w") as f:
                json.dump(rec, f)
    total = torch.cuda.get_device_properties(0).total_memory
    cases = [
        ("fragmenting", fragmenting_trace(), FRAGMENTATION_CAPACITY / total),
        (
            "random",
            random_trace(3000, seed=1, empty_cache_every=500, cross_stream_uses=False, max_live=256),
            None,
        ),
    ]
    for name, trace, fraction in cases:
        gpu = replay_on_gpu(trace, memory_fraction=fraction)
        rep = compare_replay(trace, gpu, config=config, memory_fraction=fraction)
        ok &= rep["exact_match_events"] == rep["compared"] and rep["real_oom"] == rep["model_oom"]
        summary["replays"].append({"trace": name} | rep)
    text = json.dumps(summary, indent=1, default=str)
    print(text)
    if args.out:
        with open(os.path.join(args.out, "fidelity_summary.json"), "w") as f:
            f.write(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
