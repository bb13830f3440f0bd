"""What the profiling chapter's exercises build on: importable while grading, no solutions inside.

- ``REASONS`` and ``bind_arguments``: the vocabulary of the sync rules and a schema-aware view of an
  ATen op's arguments (``histc(x, 4)`` -> {"self": x, "bins": 4, "min": 0, "max": 0});
- ``HOST_CATEGORIES``, ``DEVICE_CATEGORIES`` and ``load_trace``: reading an exported Chrome trace;
- ``make_model`` and ``make_batches``: the small classifier and the host batches of the training
  loops (``training_loops``), the same for a given seed on both sides of the grading boundary.

The simulated device (``async_device``) and the detector's machinery (``placement``,
``host_boundary``, ``sync_recorder``, which takes the ATen rule as an argument) are scaffolding too:
the grading sandbox ships them (``Chapter.sandbox_files``). The rule table (``sync_rules``), the
timers, the overlap loops and the trace analysis are solutions, and it does not.
"""
from __future__ import annotations

import json
import os

import torch

# Reasons, worded for a person reading a profile. Keys are short ids the tests and exercises use.
REASONS = {
    "scalar_read": "reads a device scalar on the host (.item(), bool(), int(), float()): copy + cudaStreamSynchronize",
    "nonzero": "output size is the number of nonzeros, which the host must read",
    "bool_mask_index": "a boolean mask index becomes nonzero(): the host reads the count",
    "host_index": "an index tensor on the host is copied to the device from pageable memory (waits)",
    "masked_select": "output size is the number of selected elements, which the host must read",
    "unique": "output size is the number of distinct values, which the host must read",
    "repeat_interleave": "output size is repeats.sum(), read by the host (pass output_size= to avoid it)",
    "bincount": "the number of bins is input.max() + 1, read by the host",
    "histc_range": "histc with min == max reads the range from the data (min()/max() on the host)",
    "bool_result": "the result is a Python bool, read from the device",
    "device_to_host": "device-to-host copy with non_blocking=False: the host waits for it",
    "host_to_device": "host-to-device copy with non_blocking=False: the host waits for it",
    "one_hot_classes": "one_hot without num_classes reads indices.max() on the host",
    "pageable_async": "non_blocking copy from pageable memory: the host stages the bytes (a stall set_sync_debug_mode does not report)",
    "explicit_synchronize": "torch.cuda.synchronize(): waits for every stream (on purpose)",
}

HOST_CATEGORIES = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def bind_arguments(func, args: tuple, kwargs: dict | None) -> dict:
    """The op's arguments by schema name, defaults filled in: ``histc(x, 4)`` -> {self, bins, min, max}."""
    if not isinstance(func, torch._ops.OpOverload):
        raise TypeError(f"func must be an ATen OpOverload (e.g. torch.ops.aten.nonzero.default), got {func!r}")
    kwargs = kwargs or {}
    bound = {}
    schema_args = func._schema.arguments
    if len(args) > len(schema_args):
        raise ValueError(f"{func}: {len(args)} positional arguments for a schema with {len(schema_args)}")
    for i, arg in enumerate(schema_args):
        if i < len(args) and not arg.kwarg_only:
            bound[arg.name] = args[i]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
        else:
            bound[arg.name] = None
    return bound


def load_trace(trace) -> dict:
    """A trace dict from a path (``.json``, or ``.json.gz``) or an already loaded dict."""
    if isinstance(trace, dict):
        data = trace
    elif isinstance(trace, (str, os.PathLike)):
        path = os.fspath(trace)
        if path.endswith(".gz"):
            import gzip

            with gzip.open(path, "rt") as f:
                data = json.load(f)
        else:
            with open(path) as f:
                data = json.load(f)
    else:
        raise TypeError(f"trace must be a path or a dict, got {type(trace).__name__}")
    if not isinstance(data.get("traceEvents"), list):
        raise ValueError("not a Chrome trace: no 'traceEvents' list")
    return data


# ---- the training loops' model and data (``training_loops``; exercise train_fast) ----------------------------
FEATURES, CLASSES, HIDDEN = 16, 4, 32


def make_model(seed: int = 0, device: str = "cuda") -> torch.nn.Module:
    """A small classifier (16 -> 32 -> 4), the same weights for a given seed."""
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.to(device)


def make_batches(seed: int = 0, steps: int = 4, batch: int = 8, unlabelled: float = 0.25,
                 all_unlabelled_at: int | None = None, pin: bool = False) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` host batches (x: (batch, 16) float32, y: (batch,) int64 in [-1, 4)); -1 = unlabelled.

    Every batch keeps at least one labelled row, except batch ``all_unlabelled_at`` (none at all)."""
    for name, v, lo in (("steps", steps, 0), ("batch", batch, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    if not 0 <= unlabelled <= 1:
        raise ValueError(f"unlabelled must be a fraction in [0, 1], got {unlabelled!r}")
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(steps):
        x = torch.randn(batch, FEATURES, generator=g)
        y = torch.randint(0, CLASSES, (batch,), generator=g)
        labels = y.clone()
        y[torch.rand(batch, generator=g) < unlabelled] = -1
        if i == all_unlabelled_at:
            y[:] = -1
        elif bool((y < 0).all()):          # by chance: keep one labelled row (only all_unlabelled_at has none)
            y[0] = labels[0]
        out.append((x.pin_memory(), y.pin_memory()) if pin else (x, y))
    return out
