"""Where Dynamo breaks a graph, as a rule you can run (torch/_dynamo/symbolic_convert.py,
torch/_dynamo/output_graph.py ``compile_subgraph``).

Programs here are straight-line lists of statements over one tensor ``x`` (``scaffold.STATEMENTS``),
turned into real Python functions by ``scaffold.build_program``, so the rule can be checked against
``torch._dynamo.explain`` on any list. Dynamo traces a frame statement by statement, putting tensor ops
in the current *region*. At a statement it cannot trace it ends the region, compiles it (a graph
**only if the region holds at least one op**: an empty region is no graph), lets Python run the
statement, and continues in a resume function: a new frame, a new region. At the end of the frame the
last region becomes a graph if it holds an op.

What each statement does to the region:

==============  =====================================  ==============================================
statement       code                                   effect
==============  =====================================  ==============================================
``op``          ``x = x.sin()``                        one op in the region
``no_grad``     ``with torch.no_grad(): x = x * 2``    one op (the context manager is traced)
``print``       ``print(".")``                         break (print is not traceable)
``graph_break`` ``torch._dynamo.graph_break()``        break
``item``        ``x = x + x.sum().item()``             ``sum`` joins the region, break at ``.item()``
                                                       (a Python float cannot be traced without
                                                       ``capture_scalar_outputs``), then ``add`` starts
                                                       the next region
``branch``      ``if x.sum() > 0: x = x + 1``          ``sum``, ``gt`` join the region, break at the
                ``else: x = x - 1``                    jump on a tensor's value, the taken branch's
                                                       op starts the next region
``helper``      ``x = helper(x)`` where ``helper`` is  the break inside the callee ends the *caller's*
                ``x = x.cos(); print("."); return``    region at the call; the callee runs as its own
                ``x.exp()``                            frame (its own two graphs, one break) the first
                                                       time only - later calls reuse its compiled
                                                       code; the caller resumes after the call with an
                                                       empty region
==============  =====================================  ==============================================

Counting as ``explain`` counts: ``graph_count`` is the number of graphs; each graph compiled because of
a break carries that break as its reason, so ``len(break_reasons)`` counts the breaks that ended a
**non-empty** region (a break with nothing before it is invisible to ``explain``), and
``graph_break_count`` is just ``graph_count - 1``.
"""
from __future__ import annotations

from typing import Sequence

from .scaffold import STATEMENTS, build_program, check_statements

__all__ = ["STATEMENTS", "build_program", "predict_graphs"]

def predict_graphs(statements: Sequence[str]) -> tuple[int, int]:
    """``(graph_count, breaks reported)`` that ``torch._dynamo.explain`` gives for the program."""
    graphs = breaks = 0
    ops = 0                                # tensor ops in the current region
    helper_compiled = False

    def end_region(at_break: bool) -> None:
        nonlocal graphs, breaks, ops
        if ops > 0:                        # an empty region compiles nothing and reports nothing
            graphs += 1
            breaks += at_break
        ops = 0

    for s in check_statements(statements):
        if s in ("op", "no_grad"):
            ops += 1
        elif s in ("print", "graph_break"):
            end_region(True)
        elif s in ("item", "branch"):
            ops += 1                       # sum (and gt) are traced before the break
            end_region(True)
            ops = 1                        # the add / the taken branch's op, in the resume function
        elif s == "helper":
            end_region(True)               # the caller's graph ends at the call
            if not helper_compiled:        # the callee's own frame: cos | break | exp
                graphs += 2
                breaks += 1
                helper_compiled = True
    end_region(False)
    return graphs, breaks
