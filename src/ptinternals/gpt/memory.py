"""Memory of a training step: peak allocated and reserved bytes, measured (GPU) or replayed (CPU).

On a GPU the CUDA caching allocator keeps the numbers (c10/cuda/CUDACachingAllocator.cpp,
``DeviceStats``): ``max_memory_allocated`` is the peak of bytes in live tensors, and
``max_memory_reserved`` the peak of bytes the allocator holds from the driver (tensors plus its
cache and the slack of rounding and splitting). Reset the peaks, run one step, read them.

The CPU has no such allocator and ``torch.cuda.memory_*`` return 0. There the step is recorded
with the allocator chapter's ``trace_allocations`` (a dispatch mode that sees every storage the step creates and
frees) and replayed through the allocator chapter's model of the caching allocator, after ``alloc`` events for
the tensors alive before the step (parameters, gradients, optimizer state): the numbers a GPU
with the same tensors would report, minus what kernels allocate out of sight (cuBLAS workspaces).
The report says which of the two it is.
"""
from __future__ import annotations

import torch

MiB = 1 << 20


def _resident_storages(tensors) -> list[int]:
    """nbytes of each distinct storage among ``tensors`` (tied weights count once)."""
    seen, sizes = set(), []
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() == 0:
            continue
        seen.add(storage.data_ptr())
        sizes.append(storage.nbytes())
    return sizes


def resident_tensors(model, optimizer) -> list[torch.Tensor]:
    """Tensors alive between steps: parameters, their grads, buffers, optimizer state."""
    out = list(model.parameters()) + [p.grad for p in model.parameters() if p.grad is not None]
    out += list(model.buffers())
    for state in optimizer.state.values():
        out += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return out


def measure_step_memory(step_fn, device, resident=()) -> tuple[object, dict]:
    """Run ``step_fn()`` once and return (its result, a report dict of bytes and how they were obtained)."""
    if not callable(step_fn):
        raise TypeError(f"step_fn must be callable, got {type(step_fn).__name__}")
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        result = step_fn()
        torch.cuda.synchronize(device)
        report = {"source": "torch.cuda memory stats (CUDACachingAllocator)",
                  "allocated_before": before,
                  "peak_allocated": torch.cuda.max_memory_allocated(device),
                  "peak_reserved": torch.cuda.max_memory_reserved(device),
                  "allocated_after": torch.cuda.memory_allocated(device)}
        return result, report
    from ..allocator import replay, trace_allocations

    box = []
    resident_sizes = _resident_storages(resident)
    trace = trace_allocations(lambda: box.append(step_fn()))
    prologue = [("alloc", f"resident{i}", n, 0) for i, n in enumerate(resident_sizes)]
    replayed = replay(prologue + trace, 1 << 50)                     # an ample device: never OOM
    report = {"source": ("CPU: no CUDA allocator here; the step's storages were recorded "
                         "(allocator.trace_allocations) and replayed through the allocator chapter's model of "
                         "CUDACachingAllocator"),
              "allocated_before": sum(resident_sizes),
              "peak_allocated": replayed.peak_allocated,
              "peak_reserved": replayed.peak_reserved,
              "allocated_after": replayed.allocated_bytes[-1] if replayed.allocated_bytes else 0,
              "storages_created": sum(1 for ev in trace if ev[0] == "alloc")}
    return box[0], report


def format_memory_report(report: dict) -> str:
    lines = [f"memory of the first training step ({report['source']}):"]
    for key in ("allocated_before", "peak_allocated", "peak_reserved", "allocated_after"):
        lines.append(f"  {key.replace('_', ' '):17s} {report[key] / MiB:10.2f} MiB")
    return "\n".join(lines)
