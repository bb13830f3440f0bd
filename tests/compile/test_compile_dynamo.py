"""The recording backend, explain summaries and recompilation counts, against real Dynamo.

Backends here return ``gm.forward``: Dynamo traces, nothing is code-generated, so each compilation
costs tens of milliseconds."""
import pytest
import torch
import torch.nn.functional as F

from ptinternals.compile.backends import RecordingBackend, describe_input, graph_ops
from ptinternals.compile.explain import count_breaks, explain_graphs
from ptinternals.compile.recompiles import Call, run_and_count

SCALE = 2.0


def with_print(x):
    y = x.sin()
    print("a graph break")
    return y.cos() + 1


def trailing_print(x):
    y = x * 2
    print("nothing after me")
    return y


def data_dependent(x):
    if x.sum() > 0:            # a branch on a tensor's value: Dynamo cannot know which way it goes
        return x + 1
    return x - 1


def no_break(x, n):
    return F.gelu(x * n).sum(-1)


def uses_global(x):
    return x * SCALE


@pytest.mark.parametrize("fn, graphs, breaks, ops", [
    (with_print, 2, 1, [["Tensor.sin"], ["Tensor.cos", "operator.add"]]),
    (trailing_print, 1, 1, [["operator.mul"]]),       # explain says 0 breaks: it counts graphs - 1
    (data_dependent, 2, 1, [["Tensor.sum", "operator.gt"], ["operator.add"]]),
])
def test_explain_and_the_recording_backend_agree(fn, graphs, breaks, ops, capsys):
    x = torch.ones(3)
    summary = explain_graphs(fn, x)
    assert (summary.graph_count, summary.breaks_hit) == (graphs, breaks) == count_breaks(fn, x)
    assert summary.graph_break_count == graphs - 1
    assert summary.ops_per_graph == ops
    assert all(r.reason and r.lineno for r in summary.break_reasons)
    rec = RecordingBackend()
    torch._dynamo.reset()
    rec.compile(fn)(x)
    assert [g.ops for g in rec.graphs] == ops
    assert [g.attempt for g in rec.graphs] == [0] * graphs        # new frames, not recompilations
    assert len({g.frame_id for g in rec.graphs}) == graphs        # each graph its own frame (resume functions)


def test_recording_backend_keeps_graphs_inputs_and_guards():
    torch._dynamo.reset()
    rec = RecordingBackend()
    f = rec.compile(no_break, fullgraph=True)
    x = torch.randn(2, 5)
    torch.testing.assert_close(f(x, 3), no_break(x, 3))     # the backend runs the graph unchanged
    (g,) = rec.graphs
    assert g.ops == ["operator.mul", "torch.nn.functional.gelu", "Tensor.sum"]
    assert g.example_inputs == ["f32[2, 5]"] and g.compile_id == "0/0" and not g.is_recompile
    kinds = {(r.source, r.kind) for r in g.guards}
    assert ("L['x']", "TENSOR_MATCH") in kinds
    assert any(r.source == "L['n']" and r.kind in ("EQUALS_MATCH", "CONSTANT_MATCH") for r in g.guards)
    assert rec.guards_of("0/0") == g.guards
    with pytest.raises(KeyError, match="no guards recorded"):
        rec.guards_of("7/0")
    torch._dynamo.reset()
    as_backend = RecordingBackend()               # plain torch.compile(backend=...): graphs only
    torch.compile(no_break, backend=as_backend)(torch.randn(2, 5), 3)
    assert as_backend.graph_count == 1 and as_backend.graphs[0].guards == []


def test_what_recompiles():
    x = torch.randn(4)
    report = run_and_count(no_break, [
        (x, 2),                                   # 0: first compile
        (x, 2),                                   # 1: every guard holds
        (torch.randn(5), 2),                      # 2: new size: recompile with the dim dynamic
        (torch.randn(6), 2),                      # 3: the dynamic graph serves every size
        (x, 3),                                   # 4: an int changed: recompile with n symbolic
        (x, 4),                                   # 5: reused
        (x.double(), 4),                          # 6: dtype
        (torch.randn(4, requires_grad=True), 4),  # 7: requires_grad
        (torch.randn(8)[::2], 4),                 # 8: strides
        Call(args=(x,), kwargs={"n": 2.5}),       # 9: a float where an int was: type guard
    ])
    assert report.compiled_per_call == [1, 0, 1, 0, 1, 0, 1, 1, 1, 1]
    assert report.recompiled_calls == [False, False, True, False, True, False, True, True, True, True]
    assert report.recompiles == 6
    def failed(i, words):                         # every cached entry tried reports its failed guard
        return any(words in r for r in report.calls[i].reasons)
    assert failed(2, "size mismatch at index 0") and failed(4, "n == 2") and failed(6, "dtype mismatch")
    assert failed(7, "requires_grad mismatch") and failed(8, "stride mismatch") and failed(9, "type")
    assert report.calls[1].reasons == []
    static = run_and_count(no_break, [(torch.randn(4), 2), (torch.randn(5), 2), (torch.randn(6), 2)], dynamic=False)
    assert static.compiled_per_call == [1, 1, 1]  # dynamic=False: one compile per size


def test_globals_are_guarded():
    global SCALE
    torch._dynamo.reset()
    rec = RecordingBackend()
    f = rec.compile(uses_global)
    x = torch.ones(2)
    try:
        assert float(f(x)[0]) == 2.0
        SCALE = 3.0
        assert float(f(x)[0]) == 3.0               # not a stale constant: the guard failed
        assert rec.recompile_count == 1 and "SCALE" in rec.guard_failures[0]
    finally:
        SCALE = 2.0


def test_describe_and_bad_input():
    assert describe_input(torch.zeros(2, 3, dtype=torch.int64)) == "i64[2, 3]"
    assert describe_input(3) == "3"
    with pytest.raises(TypeError, match="GraphModule"):
        graph_ops(no_break)
    with pytest.raises(TypeError, match="callable"):
        RecordingBackend().compile(3)
    with pytest.raises(TypeError, match="inner must be a backend"):
        RecordingBackend(inner=3)
    with pytest.raises(TypeError, match="callable"):
        explain_graphs("f")
    with pytest.raises(TypeError, match=r"calls\[1\] must be a Call or a tuple"):
        run_and_count(no_break, [(torch.ones(1), 1), [torch.ones(1), 1]])
    with pytest.raises(ValueError, match="dynamic must be None, True or False"):
        run_and_count(no_break, [], dynamic="yes")
