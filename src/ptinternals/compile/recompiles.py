"""Guards and recompilation, measured (torch/_dynamo/guards.py, torch/_dynamo/convert_frame.py).

Every compiled frame keeps a cache of entries ``(guards, compiled code)`` on its code object
(torch/csrc/dynamo/cache_entry.h). On each call the guards of the entries are checked, newest first;
the first entry whose guards all pass runs. When none passes Dynamo **recompiles** the frame with the
new inputs, up to ``torch._dynamo.config.recompile_limit`` entries (8 by default), after which it
gives up on the frame and runs it eagerly.

What a guard checks, and so what makes a call recompile:

=========================  =================================================================
tensor inputs              dtype, device, requires_grad, dim, sizes and strides (each size as
                           a constant until a size changes: then "automatic dynamic shapes"
                           recompiles once with that dim symbolic, and later sizes reuse it;
                           sizes 0 and 1 stay specialised, so a change to 1 recompiles too),
                           dispatch keys (e.g. inference mode)
Python ints and floats     their value, until one changes: then they become symbolic too
                           (``specialize_float=False``, the default in current torch)
bools, strings, None       their value (a branch on them was resolved while tracing)
globals and modules        identity (``ID_MATCH``) of functions and modules used, and the value
                           of global constants read
global state               grad mode, default device, deterministic algorithms, autocast...
=========================  =================================================================

:func:`run_and_count` calls a function compiled by Dynamo on a sequence of inputs and reports, per call,
whether Dynamo compiled (and why, from ``guard_fail_fn``); it is how predictions about recompilation
are checked against the real thing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from .backends import RecordingBackend

__all__ = ["CallReport", "RecompileReport", "run_and_count", "Call"]


@dataclass(frozen=True)
class Call:
    """One call's arguments: ``Call(args=(x, 3), kwargs={})``."""

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass
class CallReport:
    index: int
    compiled: int                    # graphs Dynamo compiled during this call (0: every guard held)
    recompiled: int                  # of which for a frame compiled before (attempt > 0)
    reasons: list[str]               # guard failures Dynamo reported during this call


@dataclass
class RecompileReport:
    calls: list[CallReport]
    backend: RecordingBackend

    @property
    def compiled_per_call(self) -> list[int]:
        return [c.compiled for c in self.calls]

    @property
    def recompiles(self) -> int:
        """Recompilations of already-compiled frames over the whole run."""
        return sum(c.recompiled for c in self.calls)

    @property
    def recompiled_calls(self) -> list[bool]:
        """Per call: did it recompile a frame? (the first call compiles, which is not a REcompile)."""
        return [c.recompiled > 0 for c in self.calls]


def _as_call(item: Any, i: int) -> Call:
    if isinstance(item, Call):
        return item
    if isinstance(item, tuple):
        return Call(args=item)
    raise TypeError(f"calls[{i}] must be a Call or a tuple of positional args, got {type(item).__name__}")


def run_and_count(fn: Callable, calls: Sequence, *, dynamic: bool | None = None,
                  reset: bool = True) -> RecompileReport:
    """Compile ``fn`` with a recording backend and call it on each of ``calls`` in order.

    ``calls``: a list of tuples of positional arguments (or :class:`Call`). ``dynamic`` is passed to
    Dynamo (None: automatic dynamic shapes, the default of ``torch.compile``; False: always
    specialise; True: sizes symbolic from the start). ``reset`` first clears Dynamo's caches
    (``torch._dynamo.reset()``, process-wide) so earlier compilations of ``fn`` do not count.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if isinstance(calls, (str, bytes)) or not isinstance(calls, Sequence):
        raise TypeError(f"calls must be a list of argument tuples, got {type(calls).__name__}")
    if dynamic not in (None, True, False):
        raise ValueError(f"dynamic must be None, True or False, got {dynamic!r}")
    normalized = [_as_call(item, i) for i, item in enumerate(calls)]
    if reset:
        torch._dynamo.reset()
    backend = RecordingBackend()
    compiled_fn = backend.compile(fn, dynamic=dynamic)
    reports = []
    for i, call in enumerate(normalized):
        graphs_before, failures_before = len(backend.graphs), len(backend.guard_failures)
        compiled_fn(*call.args, **call.kwargs)
        new = backend.graphs[graphs_before:]
        reports.append(CallReport(index=i, compiled=len(new), recompiled=sum(1 for g in new if g.is_recompile),
                                  reasons=list(backend.guard_failures[failures_before:])))
    return RecompileReport(calls=reports, backend=backend)
