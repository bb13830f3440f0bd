"""Reading an exported Chrome/Perfetto trace (``prof.export_chrome_trace(path)``): self and total time
per op, the GPU's idle gaps and the top kernels.

The file is JSON: ``{"traceEvents": [...], ...}``. Each timed event is a *complete* event
(``"ph": "X"``) with a name, a category, a process and thread (``pid``, ``tid``), a start ``ts`` and a
duration ``dur``, both in microseconds. Categories written by Kineto:

- host: ``cpu_op`` (ATen ops), ``user_annotation`` (``record_function`` ranges, ``ProfilerStep#N``),
  ``cuda_runtime``/``cuda_driver`` (``cudaLaunchKernel``, ``cudaMemcpyAsync``, ``cudaStreamSynchronize``);
- device (one ``tid`` per CUDA stream): ``kernel``, ``gpu_memcpy``, ``gpu_memset``; a kernel's
  ``args["External id"]`` is the ``External id`` of the ``cpu_op`` that launched it;
- Python frames: ``python_function`` (with ``with_stack=True``), host events for ``op_stats`` as for torch
  2.13's ``key_averages()`` (:func:`key_averages_categories`: torch 2.11 leaves them out);
- others this module ignores: ``gpu_user_annotation``,
  flow arrows (``ph`` "s"/"f"), metadata (``ph`` "M").

**Self versus total.** An op's *total* time is its duration; its *self* time is the duration minus
its direct children's durations. On the host, children are found as torch does in
``EventList._populate_cpu_children`` (torch/autograd/profiler_util.py): per thread, events sorted by
(start, -end), a stack of open parents; an event is a child of the innermost parent that contains it.
Times are compared as integer nanoseconds (the profiler's own unit): Kineto's timestamps are about
5e12 us, where ``ts + dur`` in floating point can miss an exact end by a nanosecond.
An op whose only child has its own name (``aten::mean`` calling ``aten::mean``) is folded into it
(``_remove_dup_nodes``). ``key_averages()`` then sums per name (``ProfilerStep#N`` as ``ProfilerStep*``).
Device time: a kernel belongs to the op that launched it (its *self* device time); an op's total
device time adds its children's.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from .scaffold import DEVICE_CATEGORIES, HOST_CATEGORIES, load_trace  # noqa: F401 - re-exported

_STEP = re.compile(r"^ProfilerStep#\d+$")


@dataclass
class TraceEvent:
    name: str
    cat: str
    pid: object
    tid: object
    ts: float
    dur: float
    args: dict = field(default_factory=dict)
    children: list = field(default_factory=list, repr=False)
    parent: "TraceEvent | None" = field(default=None, repr=False)

    @property
    def end(self) -> float:
        return self.ts + self.dur

    @property
    def start_ns(self) -> int:
        """The start in integer nanoseconds: Kineto writes microseconds with three decimals, and near
        5e12 us a float sum ``ts + dur`` is off by up to a nanosecond, so nesting compares integers."""
        return round(self.ts * 1000)

    @property
    def end_ns(self) -> int:
        return self.start_ns + round(self.dur * 1000)

    @property
    def key(self) -> str:
        """The name ``key_averages()`` groups by."""
        return "ProfilerStep*" if _STEP.match(self.name) else self.name


@dataclass
class OpStats:
    """Per-name sums, microseconds, like a row of ``key_averages()``."""

    count: int = 0
    total_us: float = 0.0
    self_us: float = 0.0
    device_total_us: float = 0.0
    device_self_us: float = 0.0


def complete_events(trace, categories) -> list[TraceEvent]:
    """The ``"ph": "X"`` events of the given categories."""
    data = load_trace(trace)
    out = []
    for e in data["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in categories:
            out.append(TraceEvent(e["name"], e["cat"], e.get("pid"), e.get("tid"), float(e["ts"]),
                                  float(e.get("dur", 0.0)), e.get("args") or {}))
    return out


def build_tree(events: list[TraceEvent]) -> list[TraceEvent]:
    """Link each host event to its innermost enclosing event on the same thread; returns the roots.

    Mirrors ``_populate_cpu_children``: an event that only partly overlaps the top of the stack
    pops it (no parent-child link between partial overlaps)."""
    roots = []
    by_thread: dict[tuple, list[TraceEvent]] = defaultdict(list)
    for e in events:
        e.children, e.parent = [], None
        by_thread[(e.pid, e.tid)].append(e)
    for thread_events in by_thread.values():
        stack: list[TraceEvent] = []
        for e in sorted(thread_events, key=lambda ev: (ev.start_ns, -ev.end_ns)):
            while stack and (e.start_ns >= stack[-1].end_ns or e.end_ns > stack[-1].end_ns):
                stack.pop()
            if stack:
                stack[-1].children.append(e)
                e.parent = stack[-1]
            else:
                roots.append(e)
            stack.append(e)
    return roots


def remove_dup_nodes(events: list[TraceEvent], own_device: dict[int, float] | None = None) -> list[TraceEvent]:
    """Fold an op into its parent when the parent has the same name and it is the parent's only child
    (``aten::mean`` calling ``aten::mean``): ``EventList._remove_dup_nodes``. The child's children and
    kernels move up (the parent's own kernels are replaced, as in torch). Returns the kept events."""
    events = sorted(events, key=lambda ev: (ev.start_ns, -ev.end_ns))
    while True:
        doomed = set()
        for e in events:
            p = e.parent
            if p is not None and p.name == e.name and len(p.children) == 1:
                p.children = e.children
                if own_device is not None:
                    own_device[id(p)] = own_device.get(id(e), 0.0)
                for c in e.children:
                    c.parent = p
                doomed.add(id(e))
        if not doomed:
            return events
        events = [e for e in events if id(e) not in doomed]


def op_stats(trace, *, host_categories=None) -> dict[str, OpStats]:
    """Per op name: calls, total and self host time, total and self device time (microseconds).

    ``host_categories`` default: ``HOST_CATEGORIES``, plus ``python_function`` when the trace has
    Python frames (``with_stack=True``): torch 2.13's ``key_averages()`` counts those as events too, so
    they are children that take their time out of the ops' self time (torch 2.11's does not: compare
    with a live profiler through :func:`key_averages_categories`)."""
    data = load_trace(trace)
    if host_categories is None:
        has_python = any(e.get("cat") == "python_function" for e in data["traceEvents"])
        host_categories = HOST_CATEGORIES + (("python_function",) if has_python else ())
    host = complete_events(data, host_categories)
    build_tree(host)
    by_external: dict[object, TraceEvent] = {}
    for e in host:
        ext = e.args.get("External id")
        if ext is not None and e.cat == "cpu_op":
            by_external[ext] = e
    own_device: dict[int, float] = defaultdict(float)   # id(op event) -> kernel time it launched
    for k in complete_events(data, DEVICE_CATEGORIES):
        op = by_external.get(k.args.get("External id"))
        if op is not None:
            own_device[id(op)] += k.dur
    host = remove_dup_nodes(host, own_device)

    device_total: dict[int, float] = {}

    def total_device(e: TraceEvent) -> float:
        if id(e) not in device_total:
            device_total[id(e)] = own_device[id(e)] + sum(total_device(c) for c in e.children)
        return device_total[id(e)]

    stats: dict[str, OpStats] = defaultdict(OpStats)
    for e in sorted(host, key=lambda ev: (ev.start_ns, -ev.end_ns)):
        s = stats[e.key]
        s.count += 1
        s.total_us += e.dur
        s.self_us += e.dur - sum(c.dur for c in e.children)
        s.device_total_us += total_device(e)
        s.device_self_us += own_device[id(e)]
    return dict(stats)


def top_ops(stats: dict[str, OpStats], k: int = 5, *, by: str = "self_us") -> list[tuple[str, OpStats]]:
    """The ``k`` ops with the largest ``by`` (an ``OpStats`` field); ties broken by name."""
    if by not in OpStats.__dataclass_fields__:
        raise ValueError(f"by must be an OpStats field ({sorted(OpStats.__dataclass_fields__)}), got {by!r}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an int >= 0, got {k!r}")
    return sorted(stats.items(), key=lambda kv: (-getattr(kv[1], by), kv[0]))[:k]


def top_kernels(trace, k: int = 5) -> list[tuple[str, int, float]]:
    """(name, launches, total microseconds) of the ``k`` device activities with the most total time."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an int >= 0, got {k!r}")
    totals: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for e in complete_events(trace, DEVICE_CATEGORIES):
        totals[e.name][0] += 1
        totals[e.name][1] += e.dur
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1][1], kv[0]))[:k]
    return [(name, n, us) for name, (n, us) in ranked]


def busy_intervals(spans) -> list[tuple[float, float]]:
    """The union of (start, end) intervals as sorted, disjoint intervals (touching ones merge)."""
    merged: list[list[float]] = []
    for s, e in sorted(spans):
        if e < s:
            raise ValueError(f"interval ({s}, {e}) ends before it starts")
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def gpu_idle_gaps(trace, *, min_gap_us: float = 0.0) -> list[tuple[float, float]]:
    """Intervals between the first and last device activity where no kernel, copy or memset runs
    on any stream; only gaps longer than ``min_gap_us``."""
    if not min_gap_us >= 0:
        raise ValueError(f"min_gap_us must be >= 0, got {min_gap_us!r}")
    busy = busy_intervals((e.ts, e.end) for e in complete_events(trace, DEVICE_CATEGORIES))
    return [(a_end, b_start) for (_, a_end), (b_start, _) in zip(busy, busy[1:]) if b_start - a_end > min_gap_us]


def gpu_utilization(trace) -> float | None:
    """Busy fraction of the device between its first and last activity (None without device events)."""
    busy = busy_intervals((e.ts, e.end) for e in complete_events(trace, DEVICE_CATEGORIES))
    if not busy:
        return None
    span = busy[-1][1] - busy[0][0]
    return 1.0 if span == 0 else sum(e - s for s, e in busy) / span


def op_times(trace) -> dict[str, tuple[int, float, float]]:
    """``{name: (count, self_us, total_us)}`` of the host events: :func:`op_stats` in the exercise's shape."""
    return {name: (s.count, s.self_us, s.total_us) for name, s in op_stats(trace).items()}


def gpu_activity(trace, k: int = 3, min_gap_us: float = 0.0) -> dict:
    """The device rows of a trace in one dict: idle ``gaps``, ``top_kernels`` and ``utilization``."""
    return {"gaps": gpu_idle_gaps(trace, min_gap_us=min_gap_us), "top_kernels": top_kernels(trace, k),
            "utilization": gpu_utilization(trace)}


def key_averages_categories(trace) -> tuple[str, ...]:
    """The host categories the installed torch's ``prof.key_averages()`` counts for ``trace``.

    Kineto exports Python frames (``with_stack=True``) as ``python_function`` events on every torch. torch
    2.13's ``key_averages()`` counts them as events (``FunctionEvent(is_python_function=...)``): they are
    children that take their time out of their callers' self time, and have rows of their own. torch 2.11's
    (the GPU machine's) leaves them out: no rows, and an op's self time includes the frames under it.
    ``op_stats``' default, like the op_times exercise, follows 2.13 on every torch (the answer depends on
    the trace alone); pass this as ``host_categories`` to compare with a live profiler's table."""
    import inspect

    from torch.autograd.profiler_util import FunctionEvent

    data = load_trace(trace)
    has_python = any(e.get("cat") == "python_function" for e in data["traceEvents"])
    counted = "is_python_function" in inspect.signature(FunctionEvent).parameters
    return HOST_CATEGORIES + (("python_function",) if has_python and counted else ())


def keys_inside_steps(trace, *, host_categories=None) -> set[str]:
    """Names whose every event lies inside a ``ProfilerStep#N`` range. Python frames that straddle the
    profiler's start or stop (``<module>``, ``profiler.step``) are cut at the trace's edges, and even
    ``key_averages()`` gives them negative self times: compare only what is inside the steps."""
    data = load_trace(trace)
    if host_categories is None:
        has_python = any(e.get("cat") == "python_function" for e in data["traceEvents"])
        host_categories = HOST_CATEGORIES + (("python_function",) if has_python else ())
    events = complete_events(data, host_categories)
    build_tree(events)
    inside, outside = set(), set()
    for e in events:
        p = e
        while p is not None and not _STEP.match(p.name):
            p = p.parent
        (inside if p is not None else outside).add(e.key)
    return inside - outside


def compare_with_key_averages(stats: dict[str, OpStats], key_averages, *, rel: float = 0.02,
                              abs_us: float = 2.0, keys=None, device: bool = False) -> list[str]:
    """Disagreements between ``op_stats`` and ``prof.key_averages()`` (empty when they agree).

    Counts must match; times within ``abs_us`` per call plus ``rel`` of the value (the trace rounds to
    nanoseconds, the profiler keeps its own clock). ``keys``: compare only these names. ``device``:
    also compare self and total device time (``self_device_time_total``, ``device_time_total``)."""
    problems = []
    theirs = {evt.key: evt for evt in key_averages}
    for key, s in stats.items():
        if keys is not None and key not in keys:
            continue
        evt = theirs.get(key)
        if evt is None:
            problems.append(f"{key}: in the trace, not in key_averages()")
            continue
        if evt.count != s.count:
            problems.append(f"{key}: count {s.count} vs key_averages {evt.count}")
        pairs = [(s.self_us, evt.self_cpu_time_total, "self"), (s.total_us, evt.cpu_time_total, "total")]
        if device:
            pairs += [(s.device_self_us, evt.self_device_time_total, "self device"),
                      (s.device_total_us, evt.device_time_total, "total device")]
        for mine, their, what in pairs:
            if abs(mine - their) > abs_us * s.count + rel * abs(their):
                problems.append(f"{key}: {what} {mine:.3f} us vs key_averages {their:.3f} us")
    return problems
