"""The compile chapter's checkers beyond the shared bank tests: their truth agrees with torch's other
reports, their cases hold the boundary classes, and the static policy refuses the shortcuts (calling
torch's own rewriter, DCE, partitioner, Dynamo, networkx; hiding a name) and nothing the solutions use.

The expected answers are computed once per process (``Exercise.cases_and_expected``); the tests here
use only cheap ones or the ones the bank tests compute anyway."""
from __future__ import annotations

import re

import nbformat
import pytest
import torch
import torch.nn.functional as F

from ptinternals.checks import compile as C
from ptinternals.checks.probes import compile as P
from ptinternals.compile.workloads import fx_graph
from ptinternals.grading import CheckFailure, check
from ptinternals.grading.exercise import load_chapter
from ptinternals.grading.testing import ROOT, answer_sources, namespace_with

CHAPTER = load_chapter("compile")


def answer_cells(**replace) -> list[dict]:
    """The solution's answer cells, some replaced: ``{"fuse_add_gelu": source}``."""
    sources = {k: v for k, v in answer_sources("compile").items() if k != "setup"}
    for name, source in replace.items():
        sources[f"{name}_code"] = source
    return [{"id": k, "source": v} for k, v in sources.items()]


def ex(name: str):
    return CHAPTER.exercise(f"compile.{name}")


def problems(exercise, cells: list[dict]) -> str | None:
    """What the trusted grader says about ``cells`` for ``exercise`` (its source_problem, as grade_notebook
    calls it)."""
    return exercise.source_problem({c["id"]: c["source"] for c in cells}, own_cell=exercise.answer_cell)


# ---- the static policy --------------------------------------------------------------------------
def test_the_solutions_pass_every_policy():
    cells = answer_cells()
    assert {e.id: problems(e, cells) for e in CHAPTER.exercises} == {e.id: None for e in CHAPTER.exercises}


CHEATS = {
    "torch's rewriter": ("fuse_add_gelu", """
from torch.fx import subgraph_rewriter
def fuse_add_gelu(gm, fused_op):
    r = torch.fx.Graph(); a, b = r.placeholder("a"), r.placeholder("b"); r.output(r.call_function(fused_op, (a, b)))
    return len(subgraph_rewriter.replace_pattern(gm, lambda a, b: F.gelu(a + b), r))
""", "subgraph_rewriter"),
    "torch's DCE": ("dead_code", """
def eliminate_dead_code(gm):
    before = [n.name for n in gm.graph.nodes]
    gm.graph.eliminate_dead_code(is_impure_node=lambda n: n.is_impure() or n.op == "call_method")
    gm.recompile()
    return [n for n in reversed(before) if n not in {m.name for m in gm.graph.nodes}]
""", ".eliminate_dead_code"),
    "torch's impurity rule": ("dead_code", """
def eliminate_dead_code(gm):
    removed = []
    for node in reversed(list(gm.graph.nodes)):
        if not node.users and not node.is_impure():
            removed.append(node.name); gm.graph.erase_node(node)
    gm.recompile()
    return removed
""", ".is_impure"),
    "torch's partitioner": ("choose_saved", """
from functorch.compile import min_cut_rematerialization_partition
def choose_saved(joint, num_fwd_outputs):
    fw, bw = min_cut_rematerialization_partition(joint, [], num_fwd_outputs=num_fwd_outputs)
    return [n.name for n in list(fw.graph.nodes)[-1].args[0][num_fwd_outputs:]]
""", "functorch.compile"),
    "networkx": ("min_cut", """
import networkx as nx
def min_cut(edges, source, sink):
    g = nx.DiGraph(); g.add_edges_from((u, v, {"capacity": c}) for u, v, c in edges)
    value, (_, side) = nx.minimum_cut(g, source, sink)
    return value, side
""", "networkx"),
    "Dynamo inside a predictor": ("predict_graphs", """
def predict_graphs(statements):
    from ptinternals.compile.scaffold import build_program
    out = torch._dynamo.explain(build_program(statements))(torch.ones(3))
    return out.graph_count, len(out.break_reasons)
""", "torch"),
    "torch's recording backend": ("recording_backend", """
from torch._dynamo.testing import EagerAndRecordGraphs
def make_recording_backend():
    b = EagerAndRecordGraphs()
    return b, b.graphs
""", "EagerAndRecordGraphs"),
    "a name built from strings": ("fuse_add_gelu", """
def fuse_add_gelu(gm, fused_op):
    rewriter = getattr(torch.fx, "subgraph" + "_rewriter")
    return 0
""", "getattr with a computed attribute name"),
    "eval": ("min_cut", """
def min_cut(edges, source, sink):
    return eval("__imp" + "ort__('network' + 'x')").minimum_cut
""", "eval"),
    "importlib": ("dead_code", """
import importlib
def eliminate_dead_code(gm):
    return importlib.import_module("torch.fx").Graph
""", "importlib"),
    "sys.modules": ("fuse_add_gelu", """
import sys
def fuse_add_gelu(gm, fused_op):
    return sys.modules["torch.fx.subgraph_rewriter"]
""", "sys"),
    "a private torch attribute": ("read_kernels", """
def read_kernels(code):
    return torch._inductor.utils.run_and_get_code, []
""", "private"),
    "monkeypatching torch": ("dead_code", """
import torch.fx
torch.fx.Graph.lint = lambda self: None
def eliminate_dead_code(gm):
    return []
""", "monkeypatching"),
    "a helper in another cell": ("fuse_add_gelu", """
def fuse_add_gelu(gm, fused_op):
    return my_helper(gm, fused_op)
""", "subgraph_rewriter"),
    "the module path as a string": ("fuse_add_gelu", """
def fuse_add_gelu(gm, fused_op):
    name = "torch.fx.subgraph_rewriter"
    return 0
""", "the string"),
}


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_the_policy_refuses_each_shortcut(name):
    exercise, source, words = CHEATS[name]
    replace = {exercise: source}
    if name == "a helper in another cell":  # the helper lives in another exercise's cell, and is reached
        replace["compile_blocks"] = answer_sources("compile")["compile_blocks_code"] + (
            "\nfrom torch.fx.subgraph_rewriter import replace_pattern\n"
            "def my_helper(gm, op):\n    return len(replace_pattern(gm, lambda a, b: a, lambda a, b: a))\n")
    found = problems(ex(exercise), answer_cells(**replace))
    assert found is not None and "scores 0" in found and words in found, found
    assert re.search(r"answer cell \w+_code, line \d+", found), found


def test_the_policy_leaves_other_exercises_alone():
    """A shortcut in one answer cell costs that exercise (and those that rely on it), not the others."""
    cells = answer_cells(fuse_add_gelu=CHEATS["torch's rewriter"][1])
    failed = {e.id for e in CHAPTER.exercises if problems(e, cells)}
    assert failed == {"compile.fuse_add_gelu"}


def test_instant_feedback_names_the_shortcut():
    """check() in the notebook reads the cell that defined the function and refuses the shortcut too."""
    ns = namespace_with("compile", replace={"fuse_add_gelu_code": CHEATS["torch's rewriter"][1]})
    with pytest.raises(CheckFailure, match="subgraph_rewriter") as info:
        check("compile.fuse_add_gelu", ns["fuse_add_gelu"])
    assert info.value.category == "forbidden"


@pytest.mark.slow
def test_the_grader_fails_a_shortcut_that_gives_the_right_answers(tmp_path):
    """torch's own rewriter gives exactly the expected graphs; the grader refuses it from its source, in its
    own process (main's Exercise.source_problem hook), whatever the sandbox run reported."""
    from ptinternals.grading.sandbox import SandboxConfig
    from ptinternals.grading.trusted import grade_notebook

    source = CHEATS["torch's rewriter"][1]
    nb = nbformat.read(ROOT / "solutions" / "compile" / "compile.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "fuse_add_gelu_code":
            cell.source = source
    report = grade_notebook(nb, CHAPTER, tmp_path, SandboxConfig(), only={"compile.fuse_add_gelu"})
    (result,) = report.exercises
    assert (result.passed, result.score, result.category) == (False, 0.0, "forbidden")
    assert "subgraph_rewriter" in result.message


# ---- the truth -----------------------------------------------------------------------------------
def test_recorded_graphs_are_the_graphs_explain_counts():
    for case, expected in zip(*ex("recording_backend").cases_and_expected(hidden=False)):
        statements, sizes = case.args
        if len(sizes) == 1:
            with P.quiet():
                assert len(expected["graphs"]) == torch._dynamo.explain(P.build_program(statements))(
                    P.program_input(sizes[0])).graph_count, case.label


def test_the_dce_rule_keeps_what_torch_would_wrongly_erase():
    """torch's default rule erases x.add_(1) (a call_method) and F.dropout at torch level; both change what
    the program does, so the course's rule keeps them, and the expected answer is checked on behaviour."""
    spec = ((("add_", 0, 0), ("dropout", 0, 0), ("sin", 0, 0)), (3,))
    gm = fx_graph(spec)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    assert {n.name for n in gm.graph.nodes} == {"x", "b", "sin", "output"}
    changed = P.run_with_effects(gm)
    original = P.run_with_effects(fx_graph(spec))
    assert not torch.equal(changed["x_after"], original["x_after"])
    assert not torch.equal(changed["rng_next"], original["rng_next"])
    erased, remaining = C.torch_dce(spec)
    assert erased == [] and "add_" in remaining and "dropout" in remaining
    assert C.course_impure(next(n for n in fx_graph(((("dropout", 0, 0),), (0,))).graph.nodes if n.op == "call_function"))
    assert F.dropout in C.DROPOUTS


def test_kernel_cases_cover_both_languages_and_agree_with_the_code():
    cases, expected = ex("read_kernels").cases_and_expected(hidden=True)
    prefixes = set()
    for case, (kernels, extern) in zip(cases, expected):
        code = case.args[0]
        for name, ops in kernels:
            assert re.search(rf"^{name} = async_compile\.", code, re.M), (case.label, name)
            assert name.startswith(C.KERNEL_PREFIXES) and ops, (case.label, name)
            prefixes.add(re.match(r"(cpp|triton_\w{3})_", name).group(1))
        assert extern == re.findall(r"\bextern_kernels\.(\w+)\(", code), case.label
    assert prefixes >= {"cpp", "triton_poi", "triton_per", "triton_red"}
    assert any(not k for k, _ in expected) and any(e for _, e in expected)
    assert any("_softmax" in ops for k, _ in expected for _, ops in k)          # an op name with "_" in it


def test_the_recompile_cases_reach_the_limit_and_the_0_1_rule():
    cases, expected = ex("predict_compiles").cases_and_expected(hidden=True)
    by_label = {c.label: e for c, e in zip(cases, expected)}
    assert sum(by_label["past the recompile limit"]) == 8 and by_label["past the recompile limit"][-2:] == [0, 0]
    assert by_label["0 and 1 after a dynamic dim"] == [1, 1, 1, 1, 0]
    assert by_label["a transposed (1, 1)"] == [1, 0]


def test_partition_cases_hold_the_boundary_classes():
    cases = ex("choose_saved").all_cases()
    labels = " | ".join(c.label for c in cases)
    for words in ("ties", "frozen", "an output that is an input", "in-place", "matmuls", "reduction"):
        assert words in labels, words


# Issue 16 item 3's boundary classes, each mapped onto the exercises' declared ``boundary_classes`` (that a
# hidden case falls in each is tests/test_exercise_banks.py::test_hidden_cases_cover_the_boundary_classes),
# or the reason it does not apply to this chapter.
ISSUE_16_CLASSES = {
    "extremes of a numeric range (inf where defined, and 0)": [
        ("min_cut", "an infinite path: ValueError"), ("min_cut", "zero capacities")],
    "exact ties": [("min_cut", "a tie: the two extreme cuts differ"),
                   ("choose_saved", "pointwise only: every value the same size (ties)")],
    "every threshold and limit at equality and one step past it": [
        ("predict_compiles", "the recompile limit reached, and one call past it"),
        ("predict_compiles", "a size 0"), ("predict_compiles", "a size 1 after a dynamic dim")],
    "frozen parameters (no gradient)": [("choose_saved", "a frozen input (no gradient)")],
    "empty inputs": [("recording_backend", "the empty program: the backend is never called"),
                     ("predict_graphs", "the empty program"), ("fuse_add_gelu", "a graph with no ops"),
                     ("dead_code", "no ops"), ("min_cut", "no edges"), ("read_kernels", "no kernel at all")],
    "size-1 inputs": [("recording_backend", "an input of size 1"), ("dead_code", "a single op"),
                      ("choose_saved", "a single op"), ("compile_blocks", "a batch of 1"), ("compile_blocks", "one head")],
    "non-contiguous inputs": [("predict_compiles", "a transposed view"), ("choose_saved", "a view between ops")],
}
ISSUE_16_NOT_APPLICABLE = {
    "values near a dtype's max, subnormals, NaN": "no answer computes on tensor values: graphs, predictions, cuts "
        "and kernel lists are judged on structure, and tensors only flow through torch's kernels, compared with eager",
    "a large offset relative to the spread": "no answer computes a mean, a variance or a softmax",
    "rounding ties": "no answer rounds a number",
    "inputs left unmodified": "no exercise's text promises it: fuse_add_gelu and dead_code edit their graph in "
        "place by design, and the other answers return new values",
    "optimizers, DDP and FSDP; grads that are None; tied parameters": "the chapter has no optimizer or "
        "data-parallel exercise; compile_blocks compiles the model's blocks as they are, eager mode giving the truth",
    "attention with different query and key lengths, causal and not": "no answer implements attention",
}


def test_issue_16_boundary_classes_are_declared_or_do_not_apply():
    assert not set(ISSUE_16_CLASSES) & set(ISSUE_16_NOT_APPLICABLE)
    for cls, where in ISSUE_16_CLASSES.items():
        for name, boundary in where:
            assert boundary in ex(name).boundary_classes, (cls, name, boundary)


def test_the_written_kernel_module_needs_the_fewest_split():
    """The module in Inductor's format (read_kernels' hidden cases): every kernel name splits into torch's op
    names, and one name's first split from the left is not the fewest."""
    case = C.split_case()
    assert [k for k, _ in case.truth["kernels"]] == re.findall(r"^(\w+) = async_compile\.", case.args[0], re.M)
    for _, ops in case.truth["kernels"]:
        assert ops and all(op in C.known_op_names() for op in ops)
    assert any(len(C.first_found_split("_".join(ops))) > len(ops) for _, ops in case.truth["kernels"])
    assert any(op not in C.default_overload_names() for _, ops in case.truth["kernels"] for op in ops)


def test_min_cut_ties_and_cancellation_come_from_networkx():
    value, side = C.networkx_cut(C.NEEDS_CANCELLING, "s", "t")
    assert value == 2 and side == ["t"]
    assert C.networkx_cut([("s", "a", 1), ("a", "t", 1)], "s", "t") == (1, ["t"])   # the sink-side extreme
    assert isinstance(C.networkx_cut([("s", "t", float("inf"))], "s", "t"), C.Raises)


def test_a_cheat_that_keeps_nothing_fails_the_backend_check():
    with pytest.raises(CheckFailure, match="graph"):
        check("compile.recording_backend", lambda: ((lambda gm, ex: gm.forward), []))


# ---- bad input gets a clear error -----------------------------------------------------------------
def test_bad_specs_raise_clear_errors():
    from ptinternals.compile.inductor import generate_code
    from ptinternals.compile.scaffold import CallSpec
    from ptinternals.compile.workloads import Program, TinyGPT

    with pytest.raises(ValueError, match="unknown step 'tan'"):
        fx_graph(((("tan", 0, 0),), (1,)))
    with pytest.raises(ValueError, match="step 0 reads values 3, 0"):
        fx_graph(((("sin", 3, 0),), (1,)))
    with pytest.raises(ValueError, match="outputs must be indices in 0..1"):
        fx_graph(((("sin", 0, 0),), (2,)))
    with pytest.raises(ValueError, match="spec must be"):
        fx_graph("sin")
    with pytest.raises(ValueError, match="unknown op 'tan'"):
        Program(1, (("tan", 0, 0),), (1,), 3)
    with pytest.raises(ValueError, match="outputs"):
        Program(1, (("sin", 0, 0),), (5,), 3)
    with pytest.raises(TypeError, match="call must be a dict"):
        CallSpec.from_dict([4])
    assert CallSpec.from_dict(CallSpec((2, 2), transposed=True, n=5).as_dict()) == CallSpec((2, 2), transposed=True, n=5)
    with pytest.raises(ValueError, match="backend must be 'cpp' or 'triton'"):
        generate_code(torch.sin, torch.ones(2), backend="cuda")
    with pytest.raises(ValueError, match="n_embd divisible by n_head"):
        TinyGPT((5, 1, 3, 4, 4))


@pytest.mark.slow
def test_inductor_builds_inside_the_sandbox():
    """No check compiles with Inductor in the sandbox, but a student's code may: g++ is there (under
    bubblewrap too), the cache is the job's own folder, and the precompiled header (bigger than the
    sandbox's file-size limit) is off: by TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS=0 on torch 2.13, by the
    harness setting Inductor's config when student code imports it on torch 2.11 (no such variable there)."""
    from ptinternals.grading.sandbox import SandboxConfig, cleanup, run_job

    cell = ("import torch\nout = torch.compile(lambda x: (x.sin() * 2).relu())(torch.ones(8))\n"
            "print('INDUCTOR', float(out.sum()))\n")
    config = SandboxConfig()
    config.limits.wall_s = 600
    result = run_job({"cells": [{"id": "c", "source": cell}], "exercises": [], "cell_timeout_s": 540}, {}, config)
    try:
        assert "INDUCTOR 13.46" in result.stdout_tail, (result.isolation, result.stderr_tail[-2000:])
    finally:
        cleanup(result)
