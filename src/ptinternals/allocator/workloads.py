"""Traces to replay: a fragmenting workload (exercise e), a synthetic training step (exercise f),
random traces (property tests, benchmarks), and a tracer that records a real PyTorch function's
allocations on the CPU.

All builders are deterministic and return model traces (see ``trace.py``).
"""

from __future__ import annotations

import random
import weakref
from collections.abc import Callable

from .config import MiB
from .scaffold import FRAGMENTATION_CAPACITY, fragmenting_trace  # the workload of exercise (e)


def check_fragmentation_fix(
    fixed_trace: list,
    *,
    original: list | None = None,
    config=None,
    steps: int = 11,
    capacity: int = FRAGMENTATION_CAPACITY,
) -> dict:
    """Exercise (e), checker: does a rewrite of a fragmenting trace still do the same work, and fit?

    ``original`` is the trace that was rewritten (default ``fragmenting_trace(steps)``). The work:
    every allocation of the original whose id does not start with "scratch" (the ``keep{k}``
    tensors) is allocated with its original size on its original stream and is live at the end; and
    for every scratch allocation of the original, some scratch allocation (id starting with
    "scratch") of at least its size exists on the same stream at some point. Returns {"ok", "fits",
    "problems", "oom", "oom_event", "oom_numbers", "peak_reserved"}; ``oom_numbers`` holds the
    allocated and reserved bytes and the segment size that failed, at the OOM.
    """
    from .trace import replay, validate_trace

    events = validate_trace(fixed_trace)
    original = fragmenting_trace(steps) if original is None else validate_trace(original)
    problems = []
    allocs = {e[1]: (e[2], e[3]) for e in events if e[0] == "alloc"}
    freed = {e[1] for e in events if e[0] == "free"}
    scratch = [(n, s) for i, (n, s) in allocs.items() if str(i).startswith("scratch")]
    for e in original:
        if e[0] != "alloc":
            continue
        key, size, stream = e[1], e[2], e[3]
        if str(key).startswith("scratch"):
            if not any(n >= size and s == stream for n, s in scratch):
                problems.append(f"no scratch buffer of >= {size} bytes on stream {stream} (for {key})")
        elif allocs.get(key) != (size, stream):
            got = allocs.get(key)
            problems.append(f"{key} must be allocated with {size} bytes on stream {stream}, got "
                            f"{'nothing' if got is None else f'{got[0]} bytes on stream {got[1]}'}")
        elif key in freed:
            problems.append(f"{key} must stay live to the end (it is freed)")
    result = replay(events, capacity, config=config)
    fits_ = result.oom is None
    return {
        "ok": fits_ and not problems,
        "fits": fits_,
        "problems": problems,
        "oom": None if fits_ else result.oom["message"],
        "oom_event": None if fits_ else result.oom["event_index"],
        "oom_numbers": None if fits_ else {k: result.oom[k] for k in ("allocated_bytes", "reserved_bytes",
                                                                      "alloc_size", "device_free")},
        "peak_reserved": result.peak_reserved,
    }


def fragmentation_numbers(trace: list, capacity: int = FRAGMENTATION_CAPACITY, config=None) -> dict:
    """The numbers a segment map shows after replaying ``trace`` on a GPU of ``capacity`` bytes (at the
    OOM, if it runs out): ``oom_event`` (or None), ``reserved``, ``allocated``, ``peak_reserved``,
    ``segments`` (as a snapshot lists them: one per cudaMalloc, one per mapped range of an expandable
    segment) and ``largest_free`` (the biggest cached free block: the biggest request served without
    asking the driver)."""
    from .trace import replay

    r = replay(trace, capacity, config=config)
    a = r.allocator
    segments = a.segments()
    free = [b.size for seg in segments for b in seg if not b.allocated and b.event_count == 0]
    return {
        "oom_event": None if r.oom is None else r.oom["event_index"],
        "reserved": a.memory_reserved(),
        "allocated": a.memory_allocated(),
        "peak_reserved": a.max_memory_reserved(),
        "segments": len(segments),
        "largest_free": max(free, default=0),
    }


def fix_with_workspace(trace: list) -> tuple[list[tuple], str]:
    """The usual fix of a fragmenting trace: one preallocated scratch workspace, as big as the largest
    scratch buffer, that every step reuses. Returns ``(fixed_trace, alloc_conf)`` (no allocator setting).

    The workspace is allocated first, on the stream of the first scratch buffer, before any kept
    tensor: nothing long-lived can be carved out of a freed scratch segment any more.
    """
    from .trace import validate_trace

    events = validate_trace(trace)
    scratch = [e for e in events if e[0] == "alloc" and str(e[1]).startswith("scratch")]
    if not scratch:
        raise ValueError("trace has no scratch allocation (an id starting with 'scratch') to replace")
    workspace = ("alloc", "scratch", max(e[2] for e in scratch), scratch[0][3])
    kept = [e for e in events if not (e[0] in ("alloc", "free") and str(e[1]).startswith("scratch"))]
    return [workspace, *kept, ("free", "scratch")], ""


def training_step_trace(
    steps: int = 3,
    *,
    widths: tuple[int, ...] = (1024, 4096, 4096, 1024),
    batches: tuple[int, ...] = (256, 192, 320),
    dtype_bytes: int = 4,
    adam: bool = True,
    side_stream: int | None = 7,
) -> list[tuple]:
    """A synthetic MLP training loop (Linear + ReLU layers, Adam) as allocator events.

    Parameters and gradients are allocated once; each step allocates the batch, every layer's
    output (kept for backward) and its ReLU output, the loss, then frees activations in reverse
    while creating the gradients of the layer inputs, then runs the optimizer (Adam's two state
    tensors per parameter appear at the first step). With ``side_stream`` the input batch is
    "copied in" on that stream and handed to the default stream with ``record_stream``.
    Shapes vary per step (``batches``), as in inference with variable batch sizes. This is a
    plausible sequence, not a recording: record a real one with ``trace_allocations`` (CPU) or
    ``recorder.record_trace_on_gpu`` (GPU).
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if len(widths) < 2 or any((not isinstance(w, int)) or w < 1 for w in widths):
        raise ValueError(f"widths must be >= 2 positive ints, got {widths!r}")
    if not batches or any((not isinstance(b, int)) or b < 0 for b in batches):
        raise ValueError(f"batches must be non-negative ints, got {batches!r}")
    if dtype_bytes not in (1, 2, 4, 8):
        raise ValueError(f"dtype_bytes must be 1, 2, 4 or 8, got {dtype_bytes!r}")
    t: list[tuple] = []
    layers = list(zip(widths[:-1], widths[1:], strict=True))  # (in, out) per Linear
    for i, (fi, fo) in enumerate(layers):
        t += [("alloc", f"W{i}", fi * fo * dtype_bytes, 0), ("alloc", f"b{i}", fo * dtype_bytes, 0)]
    for step in range(steps):
        n = batches[step % len(batches)]
        x = f"x{step}"
        if side_stream is not None:
            t += [("alloc", x, n * widths[0] * dtype_bytes, side_stream), ("record_stream", x, 0)]
        else:
            t.append(("alloc", x, n * widths[0] * dtype_bytes, 0))
        saved = [x]
        for i, (_, fo) in enumerate(layers):  # forward: z = x W^T + b, a = relu(z)
            t.append(("alloc", f"z{i}", n * fo * dtype_bytes, 0))
            t.append(("alloc", f"a{i}", n * fo * dtype_bytes, 0))
            saved += [f"z{i}", f"a{i}"]
        t.append(("alloc", "loss", dtype_bytes, 0))
        t.append(("alloc", "dloss", dtype_bytes, 0))
        grad = "dloss"
        for i in reversed(range(len(layers))):  # backward
            fi, fo = layers[i]
            t.append(("alloc", f"dz{i}", n * fo * dtype_bytes, 0))  # relu backward
            t.append(("free", grad))
            t.append(("free", f"a{i}"))
            if step == 0:
                t += [("alloc", f"gW{i}", fi * fo * dtype_bytes, 0), ("alloc", f"gb{i}", fo * dtype_bytes, 0)]
            else:  # accumulate into existing .grad: a temporary, then freed
                t += [("alloc", "tmp", fi * fo * dtype_bytes, 0), ("free", "tmp")]
            if i > 0:
                t.append(("alloc", f"dx{i}", n * fi * dtype_bytes, 0))
            t.append(("free", f"dz{i}"))
            t.append(("free", f"z{i}"))
            grad = f"dx{i}" if i > 0 else None
        t.append(("free", "loss"))
        t.append(("free", x))
        if side_stream is not None:
            t.append(("sync", 0))
        if adam:
            for i, (fi, fo) in enumerate(layers):
                if step == 0:
                    for s in ("m", "v"):
                        t += [
                            ("alloc", f"{s}W{i}", fi * fo * dtype_bytes, 0),
                            ("alloc", f"{s}b{i}", fo * dtype_bytes, 0),
                        ]
                t += [("alloc", "denom", fi * fo * dtype_bytes, 0), ("free", "denom")]
        t.append(("step", step))
    return t


def random_trace(
    n_events: int = 200,
    *,
    seed: int = 0,
    streams: tuple[int, ...] = (0, 1),
    max_size: int = 48 * MiB,
    empty_cache_every: int = 0,
    cross_stream_uses: bool = True,
    max_live: int | None = None,
) -> list[tuple]:
    """A random but valid trace: mixed small/medium/large sizes, frees, cross-stream uses, syncs.

    ``cross_stream_uses=False`` leaves out record_stream and sync events (whose timing on a real
    GPU depends on kernels that a replay does not run). ``max_live`` caps the live allocations
    (a free is forced when it is reached), so that long traces fit on a real GPU.
    """
    if max_live is not None and (isinstance(max_live, bool) or not isinstance(max_live, int) or max_live < 1):
        raise ValueError(f"max_live must be a positive int or None, got {max_live!r}")
    if isinstance(n_events, bool) or not isinstance(n_events, int) or n_events < 0:
        raise ValueError(f"n_events must be a non-negative int, got {n_events!r}")
    if not streams or any(not isinstance(s, int) or s < 0 for s in streams):
        raise ValueError(f"streams must be non-negative ints, got {streams!r}")
    rng = random.Random(seed)
    live: list[int] = []
    trace: list[tuple] = []
    next_id = 0
    for i in range(n_events):
        r = rng.random()
        if empty_cache_every and i % empty_cache_every == empty_cache_every - 1:
            trace.append(("empty_cache",))
        elif max_live is not None and len(live) >= max_live:
            trace.append(("free", live.pop(rng.randrange(len(live)))))
        elif r < 0.5 or not live:
            kind = rng.random()
            if kind < 0.5:
                size = rng.randint(0, 1 * MiB)  # small pool (0 = no allocation)
            elif kind < 0.85:
                size = rng.randint(1 * MiB + 1, 10 * MiB)  # 20 MiB segments
            else:
                size = rng.randint(10 * MiB, max_size)  # own segment
            trace.append(("alloc", next_id, size, rng.choice(streams)))
            live.append(next_id)
            next_id += 1
        elif r < 0.85:
            trace.append(("free", live.pop(rng.randrange(len(live)))))
        elif not cross_stream_uses:
            trace.append(("free", live.pop(rng.randrange(len(live)))))
        elif r < 0.93:
            trace.append(("record_stream", rng.choice(live), rng.choice(streams)))
        else:
            trace.append(("sync", rng.choice(streams)))
    return trace


def trace_allocations(fn: Callable[[], object]) -> list[tuple]:
    """Record the storages ``fn()`` creates and frees, as a model trace (runs on any device, e.g. CPU).

    A ``TorchDispatchMode`` sees every ATen op's outputs; an output storage that is new (not an
    input's: views and in-place results share their input's) is an "alloc" of
    ``storage.nbytes()``, and a finalizer on the storage emits the "free" when it dies. Tensors
    that existed before ``fn`` ran (parameters) are not counted.
    On a GPU the same program makes the same tensor allocations, but not the library workspaces
    (cuBLAS, cuDNN) or kernel-internal temporaries: the replay is an estimate of the real peak.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    trace: list[tuple] = []
    live: dict[int, int] = {}  # id(storage object) -> trace id
    counter = [0]

    def on_free(key: int) -> None:
        ident = live.pop(key, None)
        if ident is not None:
            trace.append(("free", ident))

    def storage_key(t) -> int | None:
        try:
            return id(t.untyped_storage())  # the storage's PyObject lives as long as the storage
        except (RuntimeError, NotImplementedError):  # tensors without storage
            return None

    class Tracer(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            inputs = {storage_key(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
            out = func(*args, **kwargs)
            for t in tree_leaves(out):
                if not isinstance(t, torch.Tensor):
                    continue
                key = storage_key(t)
                if key is None or key in live or key in inputs:  # a view, an in-place op, or seen
                    continue
                st = t.untyped_storage()
                live[key] = counter[0]
                trace.append(("alloc", counter[0], st.nbytes(), 0))
                counter[0] += 1
                weakref.finalize(st, on_free, key)
            return out

    with Tracer():
        result = fn()
    del result
    import gc

    gc.collect()
    return trace
