"""Graph breaks as ``torch._dynamo.explain`` reports them (torch/_dynamo/eval_frame.py ``explain``,
torch/_dynamo/backends/debugging.py ``ExplainOutput``).

When Dynamo meets something it cannot put in a graph (a ``print``, a branch on a tensor's *value*,
``.item()`` or ``.tolist()`` feeding Python, a call into a C extension it does not know), it **breaks
the graph**: it compiles what it captured so far, lets CPython run the offending instruction, and
continues in a *resume function* (a new frame ``torch_dynamo_resume_in_<fn>_at_<line>``) that it
compiles separately. ``fullgraph=True`` turns every break into an error.

``explain`` compiles ``fn`` once with a backend that keeps the graphs and reports:

- ``graph_count``: graphs handed to the backend. A frame whose captured region holds no tensor op
  produces no graph (Dynamo skips the backend), so ``print`` as the last statement costs no graph.
- ``graph_break_count``: defined as ``graph_count - 1``, *not* as the number of breaks. The two differ
  when a break leaves an empty region (that same trailing ``print``: 1 graph, 0 "breaks", 1 reason).
- ``break_reasons``: one per break Dynamo hit, with the user frame where it happened.

:func:`explain_graphs` returns the same facts as plain data (first line of each reason, file, line),
and :func:`count_breaks` the number that the two counters above do not tell you: breaks hit.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .backends import graph_ops

__all__ = ["BreakReason", "ExplainSummary", "explain_graphs", "count_breaks"]


@dataclass(frozen=True)
class BreakReason:
    reason: str                # first line of Dynamo's reason, e.g. "Failed to trace builtin operator"
    filename: str | None       # where in the user's code the break happened (innermost user frame)
    lineno: int | None


@dataclass
class ExplainSummary:
    graph_count: int
    graph_break_count: int     # explain's definition: graph_count - 1 (never negative)
    break_reasons: list[BreakReason] = field(default_factory=list)
    ops_per_graph: list[list[str]] = field(default_factory=list)

    @property
    def breaks_hit(self) -> int:
        return len(self.break_reasons)


def _reason(r) -> BreakReason:
    text = str(getattr(r, "reason", r)).strip()
    first = text.splitlines()[0].strip() if text else ""
    stack = getattr(r, "user_stack", None) or []
    frame = stack[-1] if stack else None
    return BreakReason(first, getattr(frame, "filename", None), getattr(frame, "lineno", None))


def explain_graphs(fn: Callable, *args: Any, **kwargs: Any) -> ExplainSummary:
    """Run ``torch._dynamo.explain(fn)(*args, **kwargs)`` and summarise it.

    Note that ``explain`` calls ``torch._dynamo.reset()`` before and after: every compiled function in
    the process loses its cached compilations (they are rebuilt on their next call).
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    out = torch._dynamo.explain(fn)(*args, **kwargs)
    return ExplainSummary(
        graph_count=int(out.graph_count),
        graph_break_count=int(out.graph_break_count),
        break_reasons=[_reason(r) for r in out.break_reasons],
        ops_per_graph=[graph_ops(g) for g in out.graphs],
    )


def count_breaks(fn: Callable, *args: Any, **kwargs: Any) -> tuple[int, int]:
    """``(graphs, breaks hit)`` for one call of ``fn``: the pair a student predicts."""
    s = explain_graphs(fn, *args, **kwargs)
    return s.graph_count, s.breaks_hit
