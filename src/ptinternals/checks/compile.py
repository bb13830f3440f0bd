"""The compile chapter's graded exercises: cases, expected answers from real torch, and likely causes.

Where the truth comes from (never from the rules written down in ``ptinternals.compile``):

- compile.recording_backend: the graphs torch's own recording backend (``torch._dynamo.testing.EagerAndRecordGraphs``)
  is handed for the same program and calls, and eager mode's outputs;
- compile.predict_graphs: ``torch._dynamo.explain`` (``graph_count``, ``len(break_reasons)``);
- compile.predict_compiles: how many frames Dynamo compiles during each call (``torch._dynamo.testing.CompileCounter``);
- compile.fuse_add_gelu: ``torch.fx.subgraph_rewriter.replace_pattern``, and the original graph's outputs;
- compile.dead_code: ``torch.fx.Graph.eliminate_dead_code`` with ``Node.is_impure`` plus the two rules torch misses
  at the torch level (in-place methods, ``F.dropout``), checked against the original graph's behaviour;
- compile.min_cut: ``networkx.minimum_cut``, the solver AOTAutograd's partitioner calls;
- compile.choose_saved: the tensors AOTAutograd's ``min_cut_rematerialization_partition`` saves;
- compile.read_kernels: Inductor's own record of the kernels it generated and the ATen ops each fused;
- compile.compile_blocks: eager mode's logits and gradients, and a counting backend's graphs and calls.

The expected answers need Dynamo, AOTAutograd and Inductor (about a minute in all on a 2-core CPU): they
are computed once per process, through ``Exercise.cases_and_expected``. Nothing in the sandbox runs
Inductor's C++ compiler: the student's code meets Dynamo and AOTAutograd only (milliseconds per graph).

The prediction and min-cut exercises run with torch, numpy and networkx absent. Every exercise also
carries a :class:`Policy`: what its source must not use (torch's own rewriter, partitioner, DCE...),
checked on the submission's source in the grader's process (see the end of this file).
"""
from __future__ import annotations

import itertools
import math
import operator
import re
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn.functional as F
from hypothesis import strategies as st

from ..compile.scaffold import STATEMENTS, CallSpec, build_program, make_args
from ..compile.workloads import FX_STEPS, IMPURE_STEPS, PROGRAM_OPS, Program, fx_graph
from ..grading._runtime import Raised
from ..grading.cases import draw
from ..grading.compare import close_tensors, describe
from ..grading.exercise import Case, Chapter, Exercise, Raises
from ..grading.policy import Policy
from .probes import compile as P

PLAIN = ("torch", "numpy", "networkx")  # absent while the plain-Python exercises are graded


def _first_difference(got: list, want: list) -> int:
    return next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))


def _close_all(got, want, what: str) -> str | None:
    if not isinstance(got, list) or len(got) != len(want):
        return f"{what}: expected {len(want)} tensors, got {describe(got)}"
    for i, (g, w) in enumerate(zip(got, want)):
        problem = close_tensors(g, w, rtol=1e-5, atol=1e-6)
        if problem:
            return f"{what}[{i}]: {problem}"
    return None


class CompileExercise(Exercise):
    """An exercise of this chapter: its :class:`Policy` is checked on the source by the trusted grader."""


# ================================================================================================
# compile.recording_backend: a backend that keeps every graph
# ================================================================================================
BREAKS = {"print", "graph_break"}


def _statements(min_size=0, max_size=6):
    return st.lists(st.sampled_from(sorted(STATEMENTS)), min_size=min_size, max_size=max_size)


def _program_label(statements, sizes=None) -> str:
    text = "program [" + ", ".join(statements) + "]" if statements else "the empty program"
    return text + (f", called on sizes {', '.join(map(str, sizes))}" if sizes and len(sizes) > 1 else "")


class RecordingBackend(CompileExercise):
    id, entry, points = "compile.recording_backend", "make_recording_backend", 1
    title = "a Dynamo backend that keeps every graph"
    probe = "ptinternals.checks.probes.compile:record_graphs"
    timeout_s = 60.0  # ~20 Dynamo compiles: 11 s in the sandbox at load 12
    boundary_classes = {
        "the empty program: the backend is never called": lambda c, e: c.args[0] == [] and e["graphs"] == [],
        "only breaks, no op: no graph": lambda c, e: c.args[0] and set(c.args[0]) <= BREAKS and not e["graphs"],
        "a break first and a break last": lambda c, e: c.args[0][0] in BREAKS and c.args[0][-1] in BREAKS,
        "the helper called twice (its frame compiled once)": lambda c, e: c.args[0].count("helper") >= 2,
        "a new size: a recompilation": lambda c, e: len(c.args[1]) > 1 and len(e["graphs"]) > 1,
        "an input of size 1": lambda c, e: 1 in c.args[1],
    }

    def visible_cases(self):
        return [Case((s, z), label=_program_label(s, z)) for s, z in (
            (["op", "op"], (3,)), (["op", "print", "op"], (3,)), (["helper", "op"], (3,)), (["op"], (3, 5)))]

    def hidden_cases(self):
        fixed = [([], (3,)), (["print"], (3,)), (["item", "branch"], (4,)), (["helper", "helper"], (3,)),
                 (["graph_break", "op", "graph_break"], (3,)), (["op", "no_grad"], (3, 5, 7)),
                 (["branch", "print"], (4, 1)), (["op", "print"], (2, 3))]
        drawn = draw(st.tuples(_statements(), st.sampled_from([(3,), (3,), (3, 5), (2, 2)])), 6)
        return [Case((s, z), label=_program_label(s, z)) for s, z in fixed + drawn]

    def expected(self, case):
        from torch._dynamo.testing import EagerAndRecordGraphs

        statements, sizes = case.args
        recorder = EagerAndRecordGraphs()
        got = P.record_graphs(lambda: (recorder, recorder.graphs), statements, sizes)
        fn = build_program(statements)
        with P.quiet():
            eager = [fn(P.program_input(n)) for n in sizes]
        return {"graphs": got["graphs"], "outputs": eager}

    def compare(self, case, got, expected):
        if not isinstance(got, dict):
            return f"the grader could not read your result: {describe(got)}"
        graphs, want = got["graphs"], expected["graphs"]
        for i, (kind, ops) in enumerate(graphs):
            if ops is None:
                return f"graphs[{i}] is a {kind}: keep the torch.fx.GraphModule your backend is given"
        if len(graphs) != len(want):
            return (f"Dynamo handed the backend {len(want)} graph(s) {[ops for _, ops in want]}\n"
                    f"     your list holds {len(graphs)}: {[ops for _, ops in graphs]}")
        for i, ((_, g), (_, w)) in enumerate(zip(graphs, want)):
            if g != w:
                return f"graph {i} should hold the ops {w}\n     got {g}"
        return _close_all(got["outputs"], expected["outputs"], "the compiled program's output")

    def diagnose(self, case, got, expected):
        if not isinstance(got, dict):
            return None
        if any(ops is None for _, ops in got["graphs"]):
            return "keep gm itself, the torch.fx.GraphModule the backend is given first (not example_inputs)."
        n, want = len(got["graphs"]), len(expected["graphs"])
        if want > 1 and n == 1:
            return ("only the last graph is kept: append each graph to the same list, never replace the list "
                    "(Dynamo calls the backend once per graph: after each graph break, at each recompilation).")
        if want and n == 0:
            return "the list returned is not the one the backend appends to: return the very list you fill."
        return None


# ================================================================================================
# compile.predict_graphs: explain's graphs and breaks, predicted
# ================================================================================================
def explain_counts(statements) -> tuple[int, int]:
    with P.quiet():
        out = torch._dynamo.explain(build_program(statements))(torch.ones(3))
    return int(out.graph_count), len(out.break_reasons)


class PredictGraphs(CompileExercise):
    id, entry, points = "compile.predict_graphs", "predict_graphs", 2
    title = "predict Dynamo's graphs and graph breaks"
    forbid = PLAIN
    timeout_s = 10.0
    boundary_classes = {
        "the empty program": lambda c, e: c.args[0] == [],
        "only breaks": lambda c, e: c.args[0] and set(c.args[0]) <= BREAKS,
        "a break with nothing before it": lambda c, e: c.args[0][0] in BREAKS and len(c.args[0]) > 1,
        "a trailing break (graph_break_count != breaks)": lambda c, e: c.args[0][-1] in BREAKS and e[1] != max(e[0] - 1, 0),
        "the helper called twice": lambda c, e: c.args[0].count("helper") >= 2,
        "a break inside a statement (item, branch)": lambda c, e: bool({"item", "branch"} & set(c.args[0])),
    }

    def visible_cases(self):
        return [Case((s,), label=_program_label(s)) for s in (
            ["op", "op"], ["op", "print", "op"], ["op", "print"], ["print", "op"], ["item"], ["op", "helper", "op"])]

    def hidden_cases(self):
        fixed = [[], ["print"], ["graph_break", "print"], ["op", "print", "print", "op"], ["branch"],
                 ["helper"], ["helper", "helper", "op"], ["op", "helper", "helper"], ["no_grad", "item", "branch"],
                 ["item", "item"], ["print", "helper", "print"], ["op", "no_grad", "graph_break"],
                 ["op", "print", "op", "print", "helper"]]                # two graphs before the helper's two
        drawn = draw(_statements(0, 8), 14)
        return [Case((s,), label=_program_label(s)) for s in fixed + drawn]

    def expected(self, case):
        return explain_counts(case.args[0])

    def compare(self, case, got, expected):
        if isinstance(got, list):
            got = tuple(got)
        if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(v, int) for v in got)):
            return f"expected a pair of ints (graph_count, breaks), got {describe(got)}"
        if got != expected:
            return f"expected (graph_count, breaks) = {expected}\n     got {got}"
        return None

    def diagnose(self, case, got, expected):
        statements = case.args[0]
        got = tuple(got) if isinstance(got, (list, tuple)) else got
        if not isinstance(got, tuple) or len(got) != 2:
            return None
        if got[0] == expected[0] and got[1] == max(expected[0] - 1, 0) != expected[1]:
            return ("that is explain's graph_break_count (graph_count - 1); count the break reasons instead: one "
                    "per break that ended a region holding at least one op.")
        helpers = statements.count("helper")
        if helpers > 1 and got[0] - expected[0] == 2 * (helpers - 1):
            return "the helper's own frame is compiled once; later calls reuse its compiled code."
        if got[0] > expected[0] and statements and statements[0] in ("print", "graph_break", "helper"):
            return "a break with nothing before it compiles nothing and reports nothing: an empty region is no graph."
        if any(s in ("item", "branch") for s in statements) and got[0] < expected[0]:
            return ("after .item() or a branch on a tensor, the resume function starts with the op that follows "
                    "(the add, or the taken branch's op): that region is not empty.")
        return None


# ================================================================================================
# compile.predict_compiles: which calls recompile
# ================================================================================================
SHAPES = [(4,), (5,), (1,), (0,), (2, 3), (3, 3), (1, 3), (2, 2, 2), (1, 1), (4, 4)]


@st.composite
def call_specs(draw_):
    shape = draw_(st.sampled_from(SHAPES))
    square = len(shape) == 2 and shape[0] == shape[1]
    return CallSpec(shape, draw_(st.sampled_from(["float32", "float32", "float64"])), draw_(st.booleans()) and
                    draw_(st.booleans()), square and draw_(st.booleans()), draw_(st.integers(0, 3)), draw_(st.booleans()))


def _calls(*specs) -> list[dict]:
    return [s.as_dict() for s in specs]


def dynamo_compiles(calls: list[dict]) -> list[int]:
    """Frames Dynamo compiles during each call of ``scaffold.f`` (a fresh cache, default settings)."""
    from torch._dynamo.testing import CompileCounter

    from ..compile.scaffold import f

    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(f, backend=counter)
    out = []
    try:
        with P.quiet():
            for call in calls:
                before = counter.frame_count
                compiled(*make_args(CallSpec.from_dict(call)))
                out.append(counter.frame_count - before)
    finally:
        torch._dynamo.reset()
    return out


def _call_text(call: dict) -> str:
    extras = [k for k in ("requires_grad", "transposed") if call.get(k)]
    return (f"shape={tuple(call['shape'])} {call['dtype']} n={call['n']} flag={call['flag']}"
            + "".join(f" {k}" for k in extras))


class PredictCompiles(CompileExercise):
    id, entry, points = "compile.predict_compiles", "predict_compiles", 2
    title = "predict which calls recompile"
    forbid = PLAIN
    timeout_s = 10.0
    boundary_classes = {
        "the recompile limit reached, and one call past it": lambda c, e: sum(e) == 8 and len(e) > 8 and e[-1] == 0,
        "a size 0": lambda c, e: any(0 in call["shape"] for call in c.args[0]),
        "a size 1 after a dynamic dim": lambda c, e: any(1 in call["shape"] for call in c.args[0][2:]) and sum(e) > 1,
        "a change of rank": lambda c, e: len({len(call["shape"]) for call in c.args[0]}) > 1,
        "a transposed view": lambda c, e: any(call["transposed"] for call in c.args[0]),
        "the same call twice: a cache hit": lambda c, e: any(a == b for a, b in zip(c.args[0], c.args[0][1:])),
        "n changes: an int becomes symbolic": lambda c, e: len({call["n"] for call in c.args[0]}) > 2,
    }

    def visible_cases(self):
        c = CallSpec
        return [Case((_calls(c((4,)), c((4,)), c((5,)), c((6,)), c((1,))),), label="sizes 4, 4, 5, 6, 1"),
                Case((_calls(c((4,), n=2), c((4,), n=3), c((4,), n=4), c((4,), flag=False)),), label="n, then flag"),
                Case((_calls(c((4,)), c((4,), dtype="float64"), c((4,), requires_grad=True)),),
                     label="dtype and requires_grad")]

    def hidden_cases(self):
        c = CallSpec
        fixed = [
            ("the same call twice", [c((4,)), c((4,))]),
            ("0 and 1 after a dynamic dim", [c((4,)), c((5,)), c((0,)), c((1,)), c((7,))]),
            ("a rank change", [c((4,)), c((2, 3)), c((3, 5)), c((2, 2, 2))]),
            ("flag back and forth", [c((4,), flag=True), c((4,), flag=False), c((4,), flag=True), c((5,), flag=False)]),
            ("a transposed view", [c((3, 3)), c((3, 3), transposed=True), c((4, 4), transposed=True), c((4, 4))]),
            ("a transposed (1, 1)", [c((1, 1)), c((1, 1), transposed=True)]),
            ("one dim changes, the other not", [c((2, 3)), c((2, 4)), c((5, 4)), c((5, 1))]),
            ("past the recompile limit", [c((4,), dtype=d, flag=fl, requires_grad=r) for d in ("float32", "float64")
                                          for fl in (True, False) for r in (False, True)] + [c((4,), n=9), c((4,))]),
            ("n changes, then sizes", [c((4,), n=0), c((4,), n=1), c((4,), n=5), c((6,), n=5)]),
            ("a transposed (2, 3), then dynamic", [c((2, 3), transposed=True), c((4, 5), transposed=True),
                                                   c((6, 7), transposed=True), c((6, 7))]),
            ("a size 1 kept while the others change", [c((2, 1, 2)), c((3, 1, 3)), c((4, 1, 5))]),
            ("a size 0 kept while the others change", [c((2, 0, 2)), c((3, 0, 3)), c((4, 0, 5))]),
            ("a dynamic dim, then size 2", [c((4,)), c((5,)), c((2,))]),
            ("n goes down", [c((4,), n=3), c((4,), n=1), c((4,), n=0)]),
            ("the rank goes down", [c((2, 3)), c((2,)), c((7,))]),
            ("a size goes down", [c((5,)), c((4,)), c((6,))]),
            ("a dim changes back to the first call's", [c((2, 3)), c((2, 4)), c((5, 3)), c((6, 7))]),
            ("a size change, then n", [c((4,)), c((5,)), c((5,), n=3)]),
            ("n dynamic, then sizes with the first n", [c((4,), n=1), c((4,), n=2), c((5,), n=1), c((6,), n=3)]),
        ]
        drawn = draw(st.lists(call_specs(), min_size=1, max_size=12), 10)
        return ([Case((_calls(*specs),), label=label) for label, specs in fixed]
                + [Case((_calls(*specs),), label=f"{len(specs)} calls") for specs in drawn])

    def expected(self, case):
        return dynamo_compiles(case.args[0])

    def compare(self, case, got, expected):
        if isinstance(got, tuple):
            got = list(got)
        if not isinstance(got, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in got):
            return f"expected a list of 0/1 per call, got {describe(got)}"
        if got != expected:
            if len(got) != len(expected):
                return f"expected one entry per call ({len(expected)}), got {len(got)}: {got}"
            i = _first_difference(got, expected)
            return (f"expected {expected}\n     got {got}\n  first difference at call {i}: "
                    f"{_call_text(case.args[0][i])} (Dynamo compiles {expected[i]}, you say {got[i]})")
        return None

    def diagnose(self, case, got, expected):
        if not isinstance(got, list) or len(got) != len(expected):
            return None
        calls = case.args[0]
        i = _first_difference(got, expected)
        if i >= len(calls):
            return None
        call, earlier = calls[i], calls[:i]
        first = earlier[0] if earlier else None
        if got[i] > expected[i]:                            # you predict a compile where Dynamo reuses or gives up
            if sum(expected[:i]) >= 8:
                return ("after 8 compiled entries (recompile_limit) Dynamo stops compiling the frame and runs "
                        "it eagerly.")
            if any(len(c["shape"]) != len(first["shape"]) for c in earlier):
                return "a change of rank makes every dim dynamic from then on (also in later compiles)."
            if len(call["shape"]) == len(first["shape"]) and tuple(call["shape"]) != tuple(first["shape"]):
                return ("after one size change the dim is dynamic: the recompiled entry serves every size >= 2 "
                        "(compare each size with the FIRST call's, not the previous one).")
        elif any(size < 2 for size in call["shape"]) and earlier:
            return "sizes 0 and 1 are always specialised: a dynamic dim guards 'size >= 2'."
        return None


# ================================================================================================
# compile.fuse_add_gelu: a pattern replacement pass
# ================================================================================================
@st.composite
def fx_specs(draw_, steps=FX_STEPS, max_steps=8):
    n = draw_(st.integers(0, max_steps))
    ops = [(draw_(st.sampled_from(steps)), draw_(st.integers(0, k)), draw_(st.integers(0, k))) for k in range(n)]
    outputs = draw_(st.lists(st.integers(0, n), min_size=1, max_size=3, unique=True))
    return (tuple(ops), tuple(outputs))


def _fx_label(spec) -> str:
    steps, outputs = spec
    body = ", ".join(f"v{k + 1}={op}(v{i}" + (f", v{j})" if op in ("add", "gelu_tanh", "aten_add_") else ")")
                     for k, (op, i, j) in enumerate(steps)) or "no ops"
    return f"x=v0; {body}; return {', '.join(f'v{k}' for k in outputs)}"


def _ops_of(case) -> list[str]:
    return [op for op, _, _ in case.args[0][0]]


def _leaked_add(spec) -> bool:
    """A gelu(add) whose add is read by something else too (torch leaves it unfused)."""
    steps, outputs = spec
    reads: dict[int, int] = {}
    for op, i, j in steps:
        for v in ((i, j) if op in ("add", "gelu_tanh", "aten_add_") else (i,)):
            reads[v] = reads.get(v, 0) + 1
    for k in outputs:
        reads[k] = reads.get(k, 0) + 1
    return any(op in ("add", "add_bias", "add_self", "add_const", "const_add") and reads.get(k + 1, 0) >= 2
               and any(o == "gelu" and i == k + 1 for o, i, _ in steps) for k, (op, _, _) in enumerate(steps))


def torch_fused(spec) -> tuple[int, list[str]]:
    """torch's subgraph_rewriter on the graph of ``spec``: (replacements, canonical graph)."""
    from torch.fx import subgraph_rewriter

    gm = fx_graph(spec)
    fused, _ = P.make_fused_op()
    replacement = fx.Graph()                                  # one call of the fused op, not traced into
    a, b = replacement.placeholder("a"), replacement.placeholder("b")
    replacement.output(replacement.call_function(fused, (a, b)))
    matches = subgraph_rewriter.replace_pattern(gm, lambda a, b: F.gelu(a + b), replacement)
    return len(matches), P.canonical(gm)


class FuseAddGelu(CompileExercise):
    id, entry, points = "compile.fuse_add_gelu", "fuse_add_gelu", 2
    title = "a pattern-replacement pass: gelu(a + b) into one op"
    probe = "ptinternals.checks.probes.compile:fuse_case"
    timeout_s = 20.0
    boundary_classes = {
        "a graph with no ops": lambda c, e: c.args[0][0] == (),
        "no match at all": lambda c, e: c.args[0][0] and e["count"] == 0,
        "a + a (one node bound twice)": lambda c, e: "add_self" in _ops_of(c),
        "a constant operand": lambda c, e: bool({"add_const", "const_add"} & set(_ops_of(c))),
        "the add has another user": lambda c, e: _leaked_add(c.args[0]),
        "gelu with a keyword": lambda c, e: "gelu_tanh" in _ops_of(c),
        "two matches, one feeding the other": lambda c, e: e["count"] >= 2,
        "an output that is the input": lambda c, e: 0 in c.args[0][1],
    }

    FIXED = {
        "the pattern alone": ((("add_bias", 0, 0), ("gelu", 1, 1)), (2,)),
        "a + a: one node bound to both inputs (torch does not match it)": ((("add_self", 0, 0), ("gelu", 1, 1)), (2,)),
        "a constant operand: gelu(x + 2)": ((("add_const", 0, 0), ("gelu", 1, 1)), (2,)),
        "the add has another user": ((("add_bias", 0, 0), ("gelu", 1, 1), ("exp", 1, 1)), (2, 3)),
        "gelu(approximate='tanh'): another function": ((("sin", 0, 0), ("gelu_tanh", 1, 0), ("gelu_bias", 2, 2)),
                                                       (3,)),
        "two matches in a chain": ((("gelu_bias", 0, 0), ("gelu_bias", 1, 1)), (2,)),
    }

    def visible_cases(self):
        return [Case((spec,), label=label) for label, spec in list(self.FIXED.items())[:4]]

    def hidden_cases(self):
        fixed = list(self.FIXED.items())[4:] + [
            ("no ops", ((), (0,))), ("a graph without the pattern", ((("sin", 0, 0), ("gelu", 1, 1)), (2,))),
            ("a constant first: gelu(2.0 + x)", ((("const_add", 0, 0), ("gelu", 1, 1), ("sin", 2, 2)), (3, 1))),
            ("the match is not an output", ((("add_bias", 0, 0), ("gelu", 1, 1), ("relu", 2, 2)), (3,))),
            ("a gelu used twice", ((("add_bias", 0, 0), ("gelu", 1, 1), ("add", 2, 2)), (3, 2))),
            ("a + a, then the pattern", ((("add_self", 0, 0), ("gelu", 1, 1), ("gelu_bias", 2, 2)), (3,))),
            ("the add read by the gelu and by sin", ((("add_bias", 0, 0), ("gelu", 1, 1), ("sin", 1, 1)), (2, 3))),
            ("relu of an add: another function", ((("add_bias", 0, 0), ("relu", 1, 1)), (2,))),
            ("gelu of a product: another op", ((("mul2", 0, 0), ("gelu", 1, 1)), (2,))),
            ("gelu of sin, then the pattern", ((("sin", 0, 0), ("gelu", 1, 1), ("gelu_bias", 2, 2)), (3,)))]
        return [Case((spec,), label=label) for label, spec in fixed] + \
               [Case((spec,), label=_fx_label(spec)) for spec in draw(fx_specs(), 24)]

    def expected(self, case):
        spec = case.args[0]
        count, graph = torch_fused(spec)
        return {"count": count, "graph": graph, "outputs": P.run_graph(fx_graph(spec)), "fused_calls": count,
                "recompiled": True}

    def compare(self, case, got, expected):
        if not isinstance(got, dict):
            return f"the grader could not read your result: {describe(got)}"
        if got["count"] != expected["count"]:
            return f"expected {expected['count']} replacement(s) (torch's subgraph_rewriter), your pass returned " \
                   f"{describe(got['count'])}"
        if got["graph"] != expected["graph"]:
            return f"the rewritten graph differs from torch's:\n  expected {expected['graph']}\n       got {got['graph']}"
        if not got["recompiled"] or got["fused_calls"] != expected["fused_calls"]:
            return (f"running the graph called the fused op {got['fused_calls']} time(s), "
                    f"expected {expected['fused_calls']}: the GraphModule still runs its old code")
        return _close_all(got["outputs"], expected["outputs"], "output")

    def diagnose(self, case, got, expected):
        if isinstance(got, Raised) and "still had" in got.message:
            return ("a match is replaceable only if its add has no user but the gelu: otherwise the add's value "
                    "is still needed (and cannot be erased).")
        if not isinstance(got, dict):
            return None
        if got["count"] == expected["count"] and got["graph"] == expected["graph"] and not got["recompiled"]:
            return "call gm.recompile() after editing gm.graph: gm(...) runs the code generated at the last recompile."
        if isinstance(got["count"], int) and got["count"] > expected["count"]:
            tanh = "approximate='tanh'"
            if " ".join(got["graph"]).count(tanh) < " ".join(expected["graph"]).count(tanh):
                return "gelu with approximate='tanh' (a keyword) is not the pattern's gelu: skip calls with kwargs."
            if "add_self" in _ops_of(case):
                return "a and b must bind two different nodes (or constants): torch's matcher does not match x + x."
        if got["graph"] != expected["graph"] and got["count"] == expected["count"]:
            return "keep the operands in order: fused_op(a, b) for gelu(a + b)."
        return None


# ================================================================================================
# compile.dead_code: dead code elimination that keeps side effects
# ================================================================================================
DROPOUTS = (F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout, torch.dropout)
# torch-level random functions and setitem: recent torch's is_impure knows them, older releases may not
TORCH_LEVEL_EFFECTS = (torch.rand, torch.randn, torch.randint, torch.randperm, torch.rand_like, torch.randn_like,
                       torch.randint_like, torch.normal, torch.poisson, torch.bernoulli, torch.multinomial,
                       operator.setitem)


def course_impure(node: fx.Node) -> bool:
    """torch's ``Node.is_impure``, plus what it misses at the torch level: in-place methods and dropout
    (and, whatever the release, the torch-level random functions and ``setitem``)."""
    if node.op == "call_method" and node.target.endswith("_") and not node.target.endswith("__"):
        return True
    if node.op == "call_function" and any(node.target is f for f in DROPOUTS + TORCH_LEVEL_EFFECTS):
        return True
    return node.is_impure()


def torch_dce(spec) -> tuple[list[str], list[str]]:
    """(erased names in erase order, remaining names) of torch's DCE with :func:`course_impure`."""
    gm = fx_graph(spec)
    before = [n.name for n in gm.graph.nodes]
    gm.graph.eliminate_dead_code(is_impure_node=course_impure)
    gm.recompile()
    remaining = [n.name for n in gm.graph.nodes]
    effects, original = P.run_with_effects(gm), P.run_with_effects(fx_graph(spec))
    for key, value in original.items():  # the truth is what the program does: torch's pass must not change it
        values = value if isinstance(value, list) else [value]
        for a, b in zip(values, effects[key] if isinstance(value, list) else [effects[key]]):
            if not torch.equal(a, b):
                raise AssertionError(f"torch's DCE changed {key} of {_fx_label(spec)}: the rule misses an effect")
    return [n for n in reversed(before) if n not in remaining], remaining


class DeadCode(CompileExercise):
    id, entry, points = "compile.dead_code", "eliminate_dead_code", 2
    title = "dead code elimination that keeps side effects"
    probe = "ptinternals.checks.probes.compile:dce_case"
    timeout_s = 20.0
    boundary_classes = {
        "no ops": lambda c, e: c.args[0][0] == (),
        "a single op": lambda c, e: len(c.args[0][0]) == 1,
        "the output is the input": lambda c, e: c.args[0][1] == (0,),
        "nothing dead": lambda c, e: c.args[0][0] and e["erased"] == [],
        "a dead chain (erasing a node kills its input)": lambda c, e: len(e["erased"]) >= 2,
        "an in-place method without users": lambda c, e: "add_" in _ops_of(c),
        "an ATen op with a mutable schema": lambda c, e: "aten_add_" in _ops_of(c),
        "torch.rand_like": lambda c, e: "rand_like" in _ops_of(c),
        "F.dropout (torch's own DCE would erase it)": lambda c, e: "dropout" in _ops_of(c),
        "an ATen random op": lambda c, e: "bernoulli" in _ops_of(c),
        "operator.setitem": lambda c, e: "setitem" in _ops_of(c),
        "an unused input (kept)": lambda c, e: all(op not in ("add_bias", "gelu_bias") for op in _ops_of(c)),
    }

    FIXED = {
        "a dead chain": ((("sin", 0, 0), ("exp", 1, 1), ("relu", 2, 2), ("gelu", 0, 0)), (4,)),
        "an in-place method nobody uses: x.add_(1)": ((("add_", 0, 0), ("sin", 0, 0)), (2,)),
        "dropout nobody uses (it draws random numbers)": ((("dropout", 0, 0), ("exp", 0, 0)), (2,)),
        "nothing dead": ((("sin", 0, 0), ("relu", 1, 1)), (2,)),
    }

    def visible_cases(self):
        return [Case((spec,), label=label) for label, spec in self.FIXED.items()]

    def hidden_cases(self):
        fixed = [
            ("everything dead, the output is the input", ((("sin", 0, 0), ("exp", 1, 1)), (0,))),
            ("no ops", ((), (0,))), ("one op", ((("exp", 0, 0),), (1,))),
            ("aten.add_ (a mutable schema)", ((("sin", 0, 0), ("aten_add_", 1, 0), ("relu", 1, 1)), (1,))),
            ("torch.rand_like nobody uses", ((("rand_like", 0, 0), ("mul2", 0, 0)), (2,))),
            ("an ATen random op nobody uses", ((("bernoulli", 0, 0), ("sin", 0, 0)), (2,))),
            ("x[0] = 0.0 (operator.setitem)", ((("sin", 0, 0), ("setitem", 0, 0), ("exp", 1, 1)), (1,))),
            ("a pure ATen op nobody uses", ((("aten_sin", 0, 0), ("relu", 0, 0)), (2,))),
            ("a dead value feeding an in-place op", ((("exp", 0, 0), ("add_", 1, 1), ("relu", 0, 0)), (3,))),
            ("a dead chain ending in dropout", ((("exp", 0, 0), ("dropout", 1, 1), ("relu", 0, 0)), (3,))),
            ("a pure method nobody uses: x.sum(-1)", ((("sum", 0, 0), ("sin", 0, 0)), (2,))),
        ]
        return [Case((spec,), label=label) for label, spec in fixed] + \
               [Case((spec,), label=_fx_label(spec)) for spec in draw(fx_specs(FX_STEPS + IMPURE_STEPS, 9), 24)]

    def expected(self, case):
        erased, remaining = torch_dce(case.args[0])
        return {"erased": erased, "remaining": remaining, "recompiled": True,
                **P.run_with_effects(fx_graph(case.args[0]))}

    def compare(self, case, got, expected):
        if not isinstance(got, dict):
            return f"the grader could not read your result: {describe(got)}"
        erased = list(got["erased"]) if isinstance(got["erased"], (list, tuple)) else got["erased"]
        if not isinstance(erased, list) or not all(isinstance(n, str) for n in erased):
            return f"expected the list of erased node names, got {describe(got['erased'])}"
        if got["remaining"] != expected["remaining"]:
            missing = [n for n in expected["remaining"] if n not in got["remaining"]]
            extra = [n for n in got["remaining"] if n not in expected["remaining"]]
            return (f"the graph keeps {got['remaining']}\n     expected {expected['remaining']}"
                    + (f"\n  erased but needed: {missing}" if missing else "")
                    + (f"\n  dead but kept: {extra}" if extra else ""))
        if erased != expected["erased"]:
            return f"the erased names (in erase order) should be {expected['erased']}\n     got {erased}"
        if not got["recompiled"]:
            return "gm still runs the code of the graph before your pass"
        for key, what in (("outputs", "output"), ("x_after", "x after the run"), ("b_after", "b after the run"),
                          ("rng_next", "the next random numbers after the run")):
            values = got[key] if isinstance(got[key], list) else [got[key]]
            want = expected[key] if isinstance(expected[key], list) else [expected[key]]
            problem = _close_all(values, want, what)
            if problem:
                return problem
        return None

    def diagnose(self, case, got, expected):
        if not isinstance(got, dict) or not isinstance(got.get("remaining"), list):
            return None
        if got["remaining"] == expected["remaining"] and not got["recompiled"]:
            return "call gm.recompile() after erasing nodes."
        erased_wrongly = [n for n in expected["remaining"] if n not in got["remaining"]]
        kept_wrongly = [n for n in got["remaining"] if n not in expected["remaining"]]
        if any(re.fullmatch(r"add_(_\d+)?", n) for n in erased_wrongly):
            return "x.add_(1) changes x: an in-place method (a name ending in one '_') is a side effect."
        if any(n.startswith(("dropout", "rand_like", "bernoulli")) for n in erased_wrongly):
            return "a random op advances the random generator: removing it changes every later random number."
        if any(n.startswith("setitem") for n in erased_wrongly):
            return "operator.setitem writes into its first argument: torch lists it in _side_effectful_functions."
        if kept_wrongly and got["remaining"] != expected["remaining"]:
            return ("walk the nodes backwards (users before producers): erasing a node can make its inputs dead "
                    "in the same pass.")
        return None


# ================================================================================================
# compile.min_cut: maximum flow and the canonical minimum cut
# ================================================================================================
def networkx_cut(edges, source, sink):
    """``(value, sorted sink side)`` from ``networkx.minimum_cut``, or :class:`Raises` when unbounded."""
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from([source, sink])
    for u, v, c in edges:
        g.add_edge(u, v, capacity=c)                         # a repeated edge replaces its capacity
    try:
        value, (_, sink_side) = nx.minimum_cut(g, source, sink)
    except nx.NetworkXUnbounded:
        return Raises(("ValueError",), "a path of infinite capacity joins source and sink")
    return (value, sorted(sink_side, key=P.label_key))


def _other_extreme(edges, source, sink):
    """The sink side of the *other* extreme minimum cut (the complement of what the source still reaches),
    from networkx on the reversed network: it differs from the expected one exactly when cuts tie."""
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from([source, sink])
    for u, v, c in edges:
        g.add_edge(v, u, capacity=c)
    _, (_, source_side) = nx.minimum_cut(g, sink, source)
    return sorted(set(g.nodes) - set(source_side), key=P.label_key)


@st.composite
def networks(draw_):
    n = draw_(st.integers(2, 9))
    caps = st.sampled_from([0, 1, 1, 2, 2, 3, 5, math.inf])
    edges = draw_(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1), caps), max_size=3 * n))
    return ([(u, v, c) for u, v, c in edges if u != v], 0, n - 1)


# the shortest augmenting path s-a-b-t blocks both others: the second unit of flow must cancel a -> b
NEEDS_CANCELLING = [("s", "a", 1), ("a", "b", 1), ("b", "t", 1), ("a", "x", 1), ("x", "y", 1), ("y", "t", 1),
                    ("s", "w", 1), ("w", "z", 1), ("z", "b", 1)]


class MinCut(CompileExercise):
    id, entry, points = "compile.min_cut", "min_cut", 2
    title = "maximum flow and the canonical minimum cut"
    forbid = PLAIN
    probe = "ptinternals.checks.probes.compile:min_cut_case"
    timeout_s = 10.0
    boundary_classes = {
        "an infinite path: ValueError": lambda c, e: isinstance(e, Raises),
        "no edges": lambda c, e: c.args[0] == [],
        "the sink unreachable: a cut of 0": lambda c, e: not isinstance(e, Raises) and e[0] == 0,
        "a tie: the two extreme cuts differ": lambda c, e: not isinstance(e, Raises) and _other_extreme(*c.args) != e[1],
        "an edge given twice": lambda c, e: len({(u, v) for u, v, _ in c.args[0]}) < len(c.args[0]),
        "edges both ways": lambda c, e: any((v, u) in {(a, b) for a, b, _ in c.args[0]} for u, v, _ in c.args[0]),
        "zero capacities": lambda c, e: any(cap == 0 for _, _, cap in c.args[0]),
    }

    def visible_cases(self):
        inf = math.inf
        return [Case(([("s", "a", 3), ("a", "t", 2), ("s", "b", 1), ("b", "t", 4)], "s", "t"), label="two paths"),
                Case(([("s", "a", 1), ("a", "t", 1)], "s", "t"), label="a tie: both edges are minimum cuts"),
                Case((NEEDS_CANCELLING, "s", "t"), label="the second unit of flow must undo part of the first"),
                Case(([("s", "a", inf), ("a", "t", inf)], "s", "t"), label="an infinite path: no finite cut")]

    def hidden_cases(self):
        inf = math.inf
        fixed = [
            ("the sink cannot be reached", [("s", "a", 2), ("t", "a", 1)], "s", "t"),
            ("no edges at all", [], "s", "t"),
            ("an edge given twice: the second replaces the first", [("s", "t", 5), ("s", "t", 2)], "s", "t"),
            ("edges both ways", [("s", "a", 2), ("a", "s", 3), ("a", "t", 2), ("t", "a", 1), ("s", "t", 1)], "s", "t"),
            ("edges both ways, the second one unsaturated", [("s", "a", 1), ("a", "t", 5), ("t", "a", 1)], "s", "t"),
            # flow pushed along a -> b adds to b -> a's own capacity (a later path needs both), not replaces it
            ("edges both ways, the reverse one used after a push", [("s", "a", 1), ("s", "c", 1), ("b", "t", 1),
                                                                   ("a", "b", 1), ("a", "d", 2), ("b", "a", 1),
                                                                   ("c", "b", 1), ("d", "t", 2)], "s", "t"),
            ("zero capacities", [("s", "a", 0), ("a", "t", 4), ("s", "b", 2), ("b", "t", 0)], "s", "t"),
            ("ties along a chain", [("s", "a", 1), ("a", "b", 1), ("b", "c", 1), ("c", "t", 1)], "s", "t"),
            ("infinite edges around finite ones", [("s", "a", inf), ("a", "b", 3), ("b", "t", inf), ("a", "c", 2),
                                                   ("c", "t", inf)], "s", "t"),
            ("an infinite path beside finite ones", [("s", "a", 1), ("a", "t", 1), ("s", "b", inf), ("b", "t", inf)],
             "s", "t"),
            ("a partitioner's network", [("source", "x_in", inf), ("x_in", "x_out", 39), ("x_out", "sin_in", inf),
                                         ("sin_in", "sin_out", 78), ("sin_out", "cos_in", inf), ("x_out", "cos_in", inf),
                                         ("cos_in", "sink", inf), ("sin_out", "sink", inf)], "source", "sink"),
        ]
        return [Case((e, s, t), label=label) for label, e, s, t in fixed] + \
               [Case(net, label=f"random network of {len(net[0])} edges") for net in draw(networks(), 30)]

    def expected(self, case):
        return networkx_cut(*case.args)

    def compare(self, case, got, expected):
        if not (isinstance(got, tuple) and len(got) == 2):
            return f"expected a pair (value, sink_side), got {describe(got)}"
        value, side = got
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not abs(value - expected[0]) <= 1e-9:
            return f"the minimum cut's capacity is {expected[0]}, got {describe(value)}"
        if not isinstance(side, list):
            return f"sink_side must be a set of nodes, got {describe(side)}"
        if set(map(P.label_key, side)) != set(map(P.label_key, expected[1])):
            return f"the sink side should be {expected[1]}\n     got {side}"
        return None

    def diagnose(self, case, got, expected):
        if isinstance(expected, Raises):
            return "when the flow you push along a path is infinite, raise ValueError: no finite cut exists."
        if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], (int, float))):
            return None
        edges, source, sink = case.args
        side = got[1] if isinstance(got[1], list) else None
        if abs(got[0] - expected[0]) <= 1e-9 and side is not None and \
                set(map(P.label_key, side)) == set(map(P.label_key, _other_extreme(*case.args))):
            return ("a tie: take the sink side as the nodes that can still reach the sink in the final residual "
                    "graph (not the complement of what the source reaches).")
        summed: dict = {}
        for u, v, c in edges:
            summed[u, v] = summed.get((u, v), 0) + c
        if len(summed) < len(edges) and got[0] == networkx_cut([(u, v, c) for (u, v), c in summed.items()],
                                                               source, sink)[0]:
            return "a repeated (u, v) replaces the earlier capacity; it does not add to it."
        if got[0] >= expected[0]:  # a residual path to the sink was left: the flow was not a maximum one
            return ("the flow is too small: pushing flow along u -> v must add the same residual capacity to "
                    "v -> u, so that a later path can undo it.")
        return None


# ================================================================================================
# compile.choose_saved: the partitioner's network
# ================================================================================================
@st.composite
def programs(draw_, max_steps=7):
    n_inputs = draw_(st.integers(1, 3))
    n = draw_(st.integers(1, max_steps))
    steps = []
    for k in range(n):
        values = n_inputs + k
        i = draw_(st.sampled_from([values - 1, draw_(st.integers(0, values - 1))]))
        steps.append((draw_(st.sampled_from(PROGRAM_OPS)), i, draw_(st.integers(0, values - 1))))
    total = n_inputs + n
    outputs = tuple(sorted({total - 1, draw_(st.sampled_from([total - 1, draw_(st.integers(n_inputs, total - 1))]))}))
    return (n_inputs, tuple(steps), outputs, draw_(st.sampled_from([3, 4, 8]))), None


PARTITION_CASES = {
    "one op: save the input or its cosine?": ((1, (("sin", 0, 0),), (1,), 4), None),
    "all values the same size: ties everywhere": ((1, (("sin", 0, 0), ("cos", 1, 1), ("exp", 2, 2), ("mul", 3, 1)),
                                                   (4,), 3), None),
    "matmuls cannot be recomputed": ((2, (("mm", 0, 1), ("relu", 2, 2), ("mm", 3, 1), ("tanh", 4, 4)), (5,), 4), None),
    "a reduction 4x smaller than its input": ((1, (("exp", 0, 0), ("rowsum", 1, 1), ("sigmoid", 2, 2)), (3,), 8), None),
    "two outputs, one used again": ((2, (("mul", 0, 1), ("sin", 2, 2), ("add", 3, 2)), (4, 2), 3), None),
    "a frozen weight (no gradient for it)": ((2, (("mm", 0, 1), ("relu", 2, 2), ("mm", 3, 1), ("tanh", 4, 4)), (5,), 4),
                                             (True, False)),
    "an output that is an input": ((2, (("mul", 0, 1), ("sin", 2, 2)), (0, 3), 3), None),
    "an in-place op (functionalised)": ((2, (("inplace", 0, 1), ("sin", 2, 2)), (3,), 4), None),
    "a transpose (a view) between ops": ((1, (("exp", 0, 0), ("t", 1, 1), ("mul", 2, 1)), (3,), 4), None),
    "one op on a frozen weight": ((2, (("mul", 0, 1),), (2,), 4), (True, False)),
}


POINTWISE = {"sin", "cos", "exp", "tanh", "sigmoid", "relu", "neg", "add", "mul", "sub"}


def _program_ops(case) -> list[str]:
    return [op for op, _, _ in case.args[0][1]]


def program_label(spec, grad) -> str:
    text = Program.from_spec(spec).source()
    return text + (f"  (requires_grad {list(grad)})" if grad else "")


class ChooseSaved(CompileExercise):
    id, entry, points = "compile.choose_saved", "choose_saved", 3
    title = "the partitioner's network: what AOTAutograd saves"
    probe = "ptinternals.checks.probes.compile:choose_saved_case"
    timeout_s = 60.0  # 17 AOTAutograd traces: 6 s in the sandbox at load 12
    boundary_classes = {
        "pointwise only: every value the same size (ties)": lambda c, e: set(_program_ops(c)) <= POINTWISE,
        "a frozen input (no gradient)": lambda c, e: c.args[1] is not None and not all(c.args[1]),
        "an output that is an input": lambda c, e: any(o < c.args[0][0] for o in c.args[0][2]),
        "an in-place op": lambda c, e: "inplace" in _program_ops(c),
        "a matmul (never recomputed)": lambda c, e: "mm" in _program_ops(c),
        "a reduction 4x smaller than its input": lambda c, e: "rowsum" in _program_ops(c) and c.args[0][3] >= 8,
        "a view between ops": lambda c, e: "t" in _program_ops(c),
        "two outputs": lambda c, e: len(c.args[0][2]) >= 2,
        "a single op": lambda c, e: len(c.args[0][1]) == 1,
    }

    def visible_cases(self):
        return [Case(args, label=label) for label, args in list(PARTITION_CASES.items())[:3]]

    def hidden_cases(self):
        fixed = [Case(args, label=label) for label, args in list(PARTITION_CASES.items())[3:]]
        return fixed + [Case(args, label=program_label(*args)) for args in draw(programs(), 8)]

    def expected(self, case):
        joint, n, saved = P.capture_joint(*case.args, partition="min_cut")
        return {"saved": saved, **_node_classes(joint, n)}

    def compare(self, case, got, expected):
        if not isinstance(got, list) or not all(isinstance(n, str) for n in got):
            return f"expected a list of node names, got {describe(got)}"
        want = expected["saved"]
        if got != want:
            return (f"AOTAutograd saves {want}\n     you save {got}"
                    + ("" if sorted(got) != sorted(want) else "\n  (the same nodes: give them in graph order)"))
        return None

    def diagnose(self, case, got, expected):
        if isinstance(got, Raised):
            if "infinite" in got.message:
                return ("an infinite path joins source and sink: bans (source -> n_in) apply to forward nodes only "
                        "(node in info.required_fw), and a tangent's closure goes n_in -> sink.")
            return None
        if not isinstance(got, list):
            return None
        want = expected["saved"]
        if set(got) & set(expected["tangent_closure"]):
            return ("you save a value that depends on a tangent: such a node is computed in the backward, so its "
                    "n_in drains to the sink (n_in -> sink) and it has no n_in -> n_out edge to cut.")
        extra = sorted(set(got) - set(expected["forward"]) - set(want))
        if extra:  # two mistakes give this symptom: name both
            return (f"you save {extra}, which only the backward computes: either it is recomputed (a node is saved "
                    f"only when its n_in is on the source side and its n_out on the sink side), or it was banned "
                    f"(bans, source -> n_in, apply to forward nodes only: node in info.required_fw).")
        if not got and want:
            return ("nothing is saved: no path joins source and sink in your network. Primals cannot be recomputed "
                    "(source -> n_in): connect the source to every primal.")
        if set(got) > set(want):
            return ("a node is saved only when its n_in is on the source side and its n_out on the sink side; "
                    "the others on the sink side are recomputed in the backward.")
        return None


def _node_classes(joint, num_fwd_outputs: int) -> dict:
    """Names of the joint graph's forward nodes (what the forward outputs need, primals included) and of
    the nodes that depend on a tangent (computed in the backward)."""
    nodes = list(joint.graph.nodes)
    out = next(n for n in nodes if n.op == "output").args[0]
    flat: list = []
    fx.node.map_aggregate(out, flat.append)
    forward = {n for n in nodes if n.op == "placeholder" and "tangents" not in n.name}
    todo = [n for n in flat[:num_fwd_outputs] if isinstance(n, fx.Node)]
    while todo:
        node = todo.pop()
        if node not in forward and "tangents" not in node.name:
            forward.add(node)
            todo.extend(node.all_input_nodes)
    closure: set = set()
    for node in nodes:
        if (node.op == "placeholder" and "tangents" in node.name) or any(a in closure for a in node.all_input_nodes):
            closure.add(node)
    return {"forward": sorted(n.name for n in forward), "tangent_closure": sorted(n.name for n in closure)}


# ================================================================================================
# compile.read_kernels: reading Inductor's output code
# ================================================================================================
def _cat_view(x):
    return torch.cat([x.exp(), x.cos()]).view(-1) * 2


KERNEL_PROGRAMS = {
    # name: (function, input shapes); every input is randn of that shape
    "pointwise chain": (lambda x: (x.sin() * 2 + 1).relu(), [(8, 8)]),
    "matmul between pointwise ops": (lambda x, w: ((x.sin() @ w).relu().sum(-1), torch.softmax(x.sin() @ w, -1)),
                                     [(16, 24), (24, 8)]),
    "softmax then layer norm": (lambda x: F.layer_norm(torch.softmax(x, -1), (8,)), [(4, 8)]),
    "cat and view": (_cat_view, [(4, 8)]),
    "a long reduction": (lambda x: (x.exp() * x).sum(), [(64, 512)]),
    "a view only: no kernel": (lambda x: x.t(), [(4, 8)]),
    "two outputs": (lambda x: (x.tanh(), x.sigmoid().sum(0)), [(4, 8)]),
    "addmm then gelu": (lambda x, w, b: F.gelu(torch.addmm(b, x, w)), [(4, 8), (8, 6), (6,)]),
    "log_softmax and mean": (lambda x: torch.log_softmax(x, -1).mean(0), [(6, 10)]),
    "where and clamp": (lambda x: torch.where(x > 0, x, 0.1 * x).clamp(-1, 1), [(5, 7)]),
    "two matmuls": (lambda x, w: (x @ w).relu() @ w.t(), [(4, 8), (8, 8)]),
    # exp_var_mean: var and mean are ops too, so the fewest pieces (exp, var_mean) must win over three
    "variance then exp": (lambda x: torch.var_mean(x, -1)[0].exp(), [(4, 8)]),
}


def inductor_truth(program: str, backend: str) -> tuple[str, dict]:
    """The output code Inductor writes for a program (C++ or Triton, nothing built) and, from Inductor's
    own records, its kernels with the ATen ops each fused and its library calls."""
    from ..compile.inductor import generate_code  # a harness: it stops Inductor after codegen, torch answers

    fn, shapes = KERNEL_PROGRAMS[program]
    gen = torch.Generator().manual_seed(0)
    with P.quiet():
        out = generate_code(fn, *[torch.randn(s, generator=gen) for s in shapes], backend=backend)
    (code,) = out.code
    records = list(out.fusion)
    kernels = []
    for name in out.kernel_names:
        body = re.sub(r"_\d+$", "", name)
        record = next(r for r in records if body.endswith(r[0]) and body[:-len(r[0])] in KERNEL_PREFIXES)
        records.remove(record)
        kernels.append((name, tuple(record[1])))
    extern = [n.split(".", 1)[1] for n in out.library]
    return code, {"kernels": kernels, "extern": extern}


KERNEL_PREFIXES = ("cpp_", "triton_poi_", "triton_per_", "triton_red_", "triton_tem_", "triton_")


@dataclass
class KernelCase(Case):
    """A case whose expected answer (Inductor's record) was taken when its code was generated."""

    truth: dict = field(default_factory=dict)
    written: bool = False  # a module written in Inductor's format, not generated: its ops are the fewest split


def known_op_names() -> frozenset[str]:
    return frozenset(n.split("::", 1)[1].split(".")[0] for n in torch._C._dispatch_get_all_op_names()
                     if n.startswith(("aten::", "prims::")))


def default_overload_names() -> frozenset[str]:
    """The op names torch lists with a default overload (``aten::sin``); ``masked_fill`` and ``softmax`` only
    come with named ones (``aten::masked_fill.Scalar``, ``aten::softmax.int``)."""
    return frozenset(n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names()
                     if n.startswith(("aten::", "prims::")) and "." not in n)


def _splits(body: str):
    """Every split of ``body`` at '_' (the '_' cut at is dropped), fewest pieces first."""
    cuts = [k for k, ch in enumerate(body) if ch == "_"]
    for r in range(len(cuts) + 1):
        for chosen in itertools.combinations(cuts, r):
            edges = [-1, *chosen, len(body)]
            yield tuple(body[a + 1:b] for a, b in zip(edges, edges[1:]))


def fewest_split(body: str) -> tuple[str, ...] | None:
    """A split of ``body`` into the fewest names torch knows, by brute force over the cut points (or None)."""
    known = known_op_names()
    return next((pieces for pieces in _splits(body) if all(p in known for p in pieces)), None)


def first_found_split(body: str) -> tuple[str, ...] | None:
    """The split a left-to-right scan keeps when each position keeps the first way it was reached (the
    longest last piece), not the fewest pieces: it differs from :func:`fewest_split` on some names."""
    known, best = known_op_names(), {-1: ()}
    for j in range(len(body) + 1):
        if j < len(body) and body[j] != "_":
            continue
        for i in sorted(best):
            if i < j and body[i + 1:j] in known and j not in best:
                best[j] = best[i] + (body[i + 1:j],)
    return best.get(len(body))


# Kernel names no program above gives, in a module written in Inductor's format: torch's op names chosen
# so that the split rule matters (a one-letter name, a name torch lists only with overloads, a name made of
# two others, a name whose fewest split is not the first one found from the left). The expected ops are the
# fewest split (brute force); the library calls are the module's.
SPLIT_KERNELS = ("cpp_fused_t_tanh_0", "cpp_fused_clamp_max_1", "cpp_fused_masked_fill_mul_2",
                 "cpp_fused_add_fill_diagonal__softmax_3")


def split_module(names=SPLIT_KERNELS) -> str:
    kernel = """{name} = async_compile.cpp_pybinding(['const float*', 'float*'], r'''
#include <torch/csrc/inductor/cpp_prefix.h>
extern "C"  void  kernel(const float* in_ptr0,
                       float* out_ptr0)
{{
    #pragma omp parallel num_threads(2)
    {{
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(32L); x0+=static_cast<int64_t>(1L))
        {{
            auto tmp0 = in_ptr0[static_cast<int64_t>(x0)];
            out_ptr0[static_cast<int64_t>(x0)] = tmp0;
        }}
    }}
}}
''')

"""
    calls = "".join(f"        buf{k + 1} = empty_strided_cpu((4, 8), (8, 1), torch.float32)\n"
                    f"        {name}(buf{k}, buf{k + 1})\n" for k, name in enumerate(names))
    return ("# AOT ID: ['0_inference']\nimport torch\nfrom torch._inductor.async_compile import AsyncCompile\n"
            "from torch._inductor.select_algorithm import extern_kernels\n\n"
            "empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu\nasync_compile = AsyncCompile()\n\n\n"
            + "".join(kernel.format(name=n) for n in names)
            + "\nasync_compile.wait(globals())\ndel async_compile\n\ndef call(args):\n    arg0_1, arg1_1 = args\n"
            "    args.clear()\n    buf0 = empty_strided_cpu((4, 8), (8, 1), torch.float32)\n"
            "    extern_kernels.mm(arg0_1, arg1_1, out=buf0)\n"
            + calls.replace("        ", "    ")
            + f"    buf{len(names) + 1} = empty_strided_cpu((4, 8), (8, 1), torch.float32)\n"
            f"    extern_kernels.addmm(buf{len(names)}, arg0_1, arg1_1, alpha=1, beta=1, out=buf{len(names) + 1})\n"
            f"    return (buf{len(names) + 1}, )\n")


def split_case() -> Case:
    kernels = [(n, fewest_split(re.sub(r"_\d+$", "", n.split("_fused_", 1)[1]))) for n in SPLIT_KERNELS]
    return KernelCase((split_module(),), label="kernel names where the split rule matters (a module in Inductor's "
                      "format: " + ", ".join(SPLIT_KERNELS) + ")", truth={"kernels": kernels, "extern": ["mm", "addmm"]},
                      written=True)


class ReadKernels(CompileExercise):
    id, entry, points = "compile.read_kernels", "read_kernels", 1
    title = "read Inductor's output code: kernels, fused ops, library calls"
    timeout_s = 20.0
    boundary_classes = {
        "no kernel at all": lambda c, e: e[0] == [],
        "C++ kernels": lambda c, e: "async_compile.cpp" in c.args[0] and e[0],
        "Triton kernels": lambda c, e: "async_compile.triton(" in c.args[0],
        "a looped Triton reduction (triton_red_)": lambda c, e: any(n.startswith("triton_red_") for n, _ in e[0]),
        "an op name with '_' in it": lambda c, e: any("_" in op for _, ops in e[0] for op in ops),
        "a one-letter op name (t)": lambda c, e: any(len(op) == 1 for _, ops in e[0] for op in ops),
        "an op torch lists only with overloads (masked_fill.Scalar)": lambda c, e: any(
            op not in default_overload_names() for _, ops in e[0] for op in ops),
        "an op name made of other op names (clamp_max)": lambda c, e: any(
            "_" in op.strip("_") and all(p in known_op_names() for p in op.split("_")) for _, ops in e[0] for op in ops),
        "a name whose fewest split is not the first found from the left": lambda c, e: any(
            first_found_split("_".join(ops)) != ops for _, ops in e[0]),
        "the same library call twice": lambda c, e: len(e[1]) > len(set(e[1])),
    }
    VISIBLE = (("pointwise chain", "cpp"), ("matmul between pointwise ops", "cpp"),
               ("matmul between pointwise ops", "triton"))

    def _case(self, program: str, backend: str) -> Case:
        code, truth = inductor_truth(program, backend)
        return KernelCase((code,), label=f"{program} ({'C++ for the CPU' if backend == 'cpp' else 'Triton'})",
                          truth=truth)

    def visible_cases(self):
        return [self._case(p, b) for p, b in self.VISIBLE]

    def hidden_cases(self):
        """Each other program once, in one language or the other (both would double a minute of Inductor)."""
        programs = [p for p in KERNEL_PROGRAMS if p not in {v for v, _ in self.VISIBLE}]
        return [self._case(p, ("triton", "cpp")[k % 2]) for k, p in enumerate(programs)] + [split_case()]

    def expected(self, case):
        return (case.truth["kernels"], case.truth["extern"])

    def compare(self, case, got, expected):
        if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], list) and isinstance(got[1], list)):
            return f"expected a pair (kernels, extern), got {describe(got)}"
        kernels, extern = got
        want_kernels, want_extern = expected
        names = [k[0] if isinstance(k, tuple) and len(k) == 2 else k for k in kernels]
        want_names = [k[0] for k in want_kernels]
        if names != want_names:
            return f"Inductor generated the kernels {want_names}\n     you found {describe(names)}"
        known = known_op_names()
        for (name, ops), (_, want) in zip(kernels, want_kernels):
            ops = tuple(ops) if isinstance(ops, (list, tuple)) else ops
            fewer = (isinstance(ops, tuple) and "_".join(ops) == "_".join(want) and len(ops) <= len(want)
                     and all(o in known for o in ops))
            if ops != want and not fewer:
                source = "the fewest split into torch's op names" if getattr(case, "written", False) else \
                    "Inductor's record"
                return f"kernel {name} fused the ATen ops {want} ({source})\n     you read {describe(ops)}"
        if extern != want_extern:
            return f"the library calls are {want_extern}\n     you found {extern}"
        return None

    def diagnose(self, case, got, expected):
        if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], list)):
            return None
        kernels, want = got[0], expected[0]
        if len(kernels) > len(want):
            return "a kernel is defined once (name = async_compile...) and called from call(): count definitions."
        if len(kernels) < len(want) and "triton" in case.label.lower():
            return "Triton kernels are defined with async_compile.triton(...) (C++ ones with cpp_pybinding)."
        for kernel, (_, ops_want) in zip(kernels, want):
            ops = kernel[1] if isinstance(kernel, tuple) and len(kernel) == 2 else None
            if not isinstance(ops, (list, tuple)):
                continue
            if any(re.search(r"(^|_)\d+$", str(o)) for o in ops):
                return "strip the kernel's trailing _<number> before splitting."
            if len(ops) > len(ops_want):
                return ("op names contain '_' themselves (_softmax, native_layer_norm): split into names torch "
                        "knows, preferring the fewest pieces.")
        return None


# ================================================================================================
# compile.compile_blocks: regional compilation of the capstone's model
# ================================================================================================
class CompileBlocks(CompileExercise):
    id, entry, points = "compile.compile_blocks", "compile_blocks", 1
    title = "regional compilation: one graph for every block"
    probe = "ptinternals.checks.probes.compile:compile_blocks_case"
    timeout_s = 120.0  # 4 s with the counting backend; an answer that compiles with Inductor builds C++ here
    boundary_classes = {
        "one block": lambda c, e: c.args[0][1] == 1,
        "four blocks": lambda c, e: c.args[0][1] == 4,
        "training: a backward through the compiled blocks": lambda c, e: c.args[2],
        "a batch of 1": lambda c, e: c.args[1] == 1,
        "one head": lambda c, e: c.args[0][2] == 1,
    }

    @staticmethod
    def _case(spec, batch, train):
        vocab, n_layer, n_head, n_embd, block = spec
        return Case((spec, batch, train), label=f"{n_layer} block(s) of width {n_embd}, {n_head} head(s), "
                                                f"batch {batch} x {block}" + (", training" if train else ""))

    def visible_cases(self):
        return [self._case((11, 2, 2, 8, 8), 2, False), self._case((11, 3, 2, 8, 8), 2, True)]

    def hidden_cases(self):
        return [self._case(*a) for a in (((7, 1, 1, 4, 5), 1, False), ((13, 4, 2, 6, 7), 3, False),
                                         ((5, 2, 3, 12, 4), 2, True), ((17, 3, 1, 10, 6), 1, False))]

    def expected(self, case):
        logits, grad = P.eager_gpt(*case.args)
        return {"logits": logits, "grad": grad, "n_layer": case.args[0][1]}

    def compare(self, case, got, expected):
        if not isinstance(got, dict):
            return f"the grader could not read your result: {describe(got)}"
        if not got["same_model"]:
            return "compile_blocks must return the model it was given (compiled in place)"
        graphs, n = got["graphs"], expected["n_layer"]
        if len(graphs) != 1:
            return f"Dynamo compiled {len(graphs)} graph(s) with your backend; regional compilation gives 1 " \
                   f"whatever the depth"
        if any("embedding" in op for op in graphs[0]):
            return "the compiled graph holds the embedding: compile the blocks, not the whole model"
        if got["calls_per_forward"] != n or got["calls_second_forward"] != n:
            return (f"a forward should run the compiled block {n} times (once per block), ran it "
                    f"{got['calls_per_forward']} then {got['calls_second_forward']} times")
        problem = close_tensors(got["logits"], expected["logits"], rtol=1e-4, atol=1e-5)
        if problem:
            return "the logits differ from eager mode's: " + problem
        if expected["grad"] is not None:
            problem = close_tensors(got["grad"], expected["grad"], rtol=1e-4, atol=1e-5)
            if problem:
                return "the gradient of the first block's c_attn.weight differs from eager mode's: " + problem
        return None

    def diagnose(self, case, got, expected):
        if not isinstance(got, dict) or not isinstance(got.get("graphs"), list):
            return None
        if not got["graphs"]:
            return ("nothing was compiled with the backend given: use block.compile(backend=backend) (in place), "
                    "not torch.compile(block, ...) whose result you drop, nor the default backend.")
        if any("embedding" in op for g in got["graphs"] for op in g):
            return "model.compile() / torch.compile(model) compiles everything; compile each block of model.transformer.h."
        if got["calls_per_forward"] < expected["n_layer"]:
            return "compile every block of model.transformer.h, not only some."
        return None


# ================================================================================================
# Method checks the student's code cannot forge: a static policy on the submission's source
# ================================================================================================
# Judged by the grader's hook (grading/policy.py) on the answer cells' text, never by code the student runs.

NO_TORCH = ("torch", "numpy", "networkx", "functorch", "scipy")
RecordingBackend.policy = Policy(
    banned=("explain", "EagerAndRecordGraphs", "AotEagerAndRecordGraphs", "CompileCounter", "CompileCounterWithBackend",
            "lookup_backend"), why="write the backend yourself: a function of (gm, example_inputs).")
PredictGraphs.policy = Policy(banned=("explain", "dynamo"), no_modules=NO_TORCH,
                              why="predict from the rule: the check runs your function without torch.")
PredictCompiles.policy = Policy(banned=("explain", "dynamo"), no_modules=NO_TORCH,
                                why="predict from the guard rules: the check runs your function without torch.")
FuseAddGelu.policy = Policy(
    banned=("subgraph_rewriter", "replace_pattern", "replace_pattern_with_filters", "SubgraphMatcher",
            "SubgraphMatcherWithNameNodeMap", "matcher_utils", "pattern_matcher", "PatternMatcherPass",
            "register_replacement"),
    why="match and rewrite the nodes yourself (walk from each gelu back to its add).")
DeadCode.policy = Policy(banned=("eliminate_dead_code", "is_impure", "dead_code_elimination"),
                         why="decide impurity and walk the graph yourself.")
MinCut.policy = Policy(banned=("minimum_cut", "maximum_flow", "max_flow", "edmonds_karp", "preflow_push",
                               "shortest_augmenting_path", "boykov_kolmogorov", "dinitz"), no_modules=NO_TORCH,
                       why="write Edmonds-Karp yourself: the check runs your function without torch or networkx.")
ChooseSaved.policy = Policy(
    banned=("min_cut_rematerialization_partition", "solve_min_cut", "choose_saved_values_set", "default_partition",
            "partitioners", "aot_function", "aot_module", "aot_autograd", "aot_module_simplified",
            "memory_efficient_fusion", "minimum_cut", "networkx", "functorch"),
    why="build the network and cut it with your own min_cut.")
ReadKernels.policy = Policy(banned=("run_and_get_code", "run_and_get_kernels", "get_fused_kernel_name",
                                    "aggregate_origins"), why="read the text you are given.")
CompileBlocks.policy = Policy(why="compile the blocks in place with the backend given.")

EXERCISES = [RecordingBackend(), PredictGraphs(), PredictCompiles(), FuseAddGelu(), DeadCode(), MinCut(),
             ChooseSaved(), ReadKernels(), CompileBlocks()]
CHAPTER = Chapter("compile", exercises=EXERCISES,
                  sandbox_files=("compile/scaffold.py", "compile/workloads.py", "compile/joint_graph.py",
                                 "compile/save_costs.py"),
                  # private names the chapter's solutions need (dotted: allowed only on that chain)
                  policy_allow=("_ops.OpOverload", "_ops.OpOverloadPacket", "_schema", "_side_effectful_functions",
                                "_C._dispatch_get_all_op_names", "_overloadpacket"))

__all__ = ["CHAPTER", "EXERCISES"]
