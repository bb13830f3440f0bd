"""The two runnable models of Dynamo's behaviour against Dynamo itself: where graphs break
(``graph_breaks.predict_graphs`` vs ``torch._dynamo.explain``) and which calls recompile
(``guard_rules.predict_compiles`` vs counted compilations)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ptinternals.compile.explain import count_breaks
from ptinternals.compile.graph_breaks import STATEMENTS, build_program, predict_graphs
from ptinternals.compile.guard_rules import RECOMPILE_LIMIT, CallSpec, f, make_args, predict_compiles
from ptinternals.compile.recompiles import run_and_count


def explain_counts(statements):
    return count_breaks(build_program(statements), torch.ones(3))


@settings(max_examples=10)
@given(st.lists(st.sampled_from(sorted(STATEMENTS)), max_size=6))
def test_break_rule_matches_explain(statements):
    assert predict_graphs(statements) == explain_counts(statements), statements


@pytest.mark.parametrize("statements, expected", [
    ([], (0, 0)),                                    # no op: no graph at all
    (["print"], (0, 0)),                             # a break with nothing before it is invisible
    (["op", "print"], (1, 1)),                       # trailing break: explain's graph_break_count says 0
    (["print", "graph_break", "op"], (1, 0)),        # consecutive breaks: empty regions
    (["item"], (2, 1)), (["branch", "branch"], (3, 2)),
    (["op", "helper", "op"], (4, 2)),                # the caller splits at the call; the callee breaks too
    (["helper", "helper"], (2, 1)),                  # the second call reuses the callee's compiled frame
])
def test_break_rule_boundaries(statements, expected):
    assert predict_graphs(statements) == expected == explain_counts(statements)


def test_break_rule_errors():
    with pytest.raises(ValueError, match=r"unknown statements \['while'\]"):
        predict_graphs(["op", "while"])
    with pytest.raises(TypeError, match="list of statement names"):
        build_program("op")


specs = st.builds(
    CallSpec,
    shape=st.sampled_from([(4,), (5,), (1,), (0,), (2, 3), (3, 3), (1, 3), (3, 1), (2, 2, 2)]),
    dtype=st.sampled_from(["float32", "float32", "float64"]),
    requires_grad=st.booleans(),
    n=st.sampled_from([0, 1, 2, 3]),
    flag=st.booleans(),
).map(lambda c: c if len(c.shape) != 2 or c.shape[0] != c.shape[1] else
      CallSpec(c.shape, c.dtype, c.requires_grad, True, c.n, c.flag))   # square ones transposed


@settings(max_examples=12)
@given(st.lists(specs, min_size=1, max_size=10))
def test_guard_rule_matches_dynamo(calls):
    real = run_and_count(f, [make_args(c) for c in calls]).compiled_per_call
    assert predict_compiles(calls) == real, calls


@pytest.mark.parametrize("name, calls", [
    ("same call twice", [CallSpec(), CallSpec()]),
    ("size, then sizes reuse the dynamic graph", [CallSpec((4,)), CallSpec((5,)), CallSpec((9,))]),
    ("size 1 is specialised", [CallSpec((4,)), CallSpec((5,)), CallSpec((1,)), CallSpec((1,)), CallSpec((6,))]),
    ("size 0 too", [CallSpec((4,)), CallSpec((5,)), CallSpec((0,))]),
    ("rank change: everything dynamic", [CallSpec((2, 3)), CallSpec((4,)), CallSpec((7,)), CallSpec((5, 6))]),
    ("flag back and forth", [CallSpec(flag=True), CallSpec(flag=False), CallSpec(flag=True)]),
    ("ints become symbolic", [CallSpec(n=2), CallSpec(n=3), CallSpec(n=0), CallSpec(n=1)]),
    ("transposed", [CallSpec((3, 3)), CallSpec((3, 3), transposed=True), CallSpec((1, 1)),
                    CallSpec((1, 1), transposed=True)]),
    ("recompile limit", [CallSpec((k,), n=k % 2, flag=k % 3 == 0, dtype=("float32", "float64")[k % 2])
                         for k in range(2, 16)]),
])
def test_guard_rule_boundaries(name, calls):
    assert predict_compiles(calls) == run_and_count(f, [make_args(c) for c in calls]).compiled_per_call


def test_recompile_limit_and_errors():
    flips = [CallSpec(n=k, dtype=("float32", "float64")[k % 2], flag=bool(k % 3), requires_grad=bool(k % 5 == 0))
             for k in range(30)]
    assert sum(predict_compiles(flips)) == RECOMPILE_LIMIT
    with pytest.raises(ValueError, match="shape must be a tuple of ints >= 0"):
        CallSpec(shape=(2, -1))
    with pytest.raises(ValueError, match="transposed needs a rank-2 shape"):
        CallSpec(shape=(3,), transposed=True)
    with pytest.raises(TypeError, match="n must be an int"):
        CallSpec(n=2.5)
    with pytest.raises(ValueError, match="dtype must be one of"):
        CallSpec(dtype="int8")
    with pytest.raises(TypeError, match=r"calls\[1\] must be a CallSpec"):
        predict_compiles([CallSpec(), (4,)])
