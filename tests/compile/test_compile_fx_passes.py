"""FX passes against torch's own: pattern replacement (torch.fx.subgraph_rewriter), dead code
elimination (Graph.eliminate_dead_code), CSE (torch/_functorch/compile_utils.fx_graph_cse), shape
propagation (torch.fx.passes.shape_prop.ShapeProp) and the NaN-locating interpreter."""
import copy
import operator

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from hypothesis import given
from torch.fx import subgraph_rewriter
from torch.fx.passes.shape_prop import ShapeProp as TorchShapeProp

from ptinternals.compile.fx_cse import eliminate_common_subexpressions
from ptinternals.compile.fx_dce import eliminate_dead_code, is_impure
from ptinternals.compile.fx_interpreter import first_non_finite
from ptinternals.compile.fx_pattern import find_matches, fuse_bias_gelu, replace_pattern
from ptinternals.compile.fx_shape_prop import ShapeProp, TensorInfo, propagate_shapes

from .fx_graphs import build_graph, graph_specs, inputs


def bias_gelu(x, b):
    return F.gelu(x + b)


def bias_relu(x, b):
    return torch.relu(x - b)


def ops_of(gm):
    return [(n.op, n.target) for n in gm.graph.nodes]


# --- pattern replacement ----------------------------------------------------------------------------

@given(graph_specs())
def test_replace_pattern_matches_torch_subgraph_rewriter(spec):
    ours, theirs = build_graph(spec), build_graph(spec)
    x, b = inputs()
    matches = replace_pattern(ours, bias_gelu, bias_relu)
    torch_matches = subgraph_rewriter.replace_pattern(theirs, bias_gelu, bias_relu)
    assert len(matches) == len(torch_matches)
    assert ours.code == theirs.code
    for got, want in zip(ours(x, b), theirs(x, b)):
        torch.testing.assert_close(got, want)


def test_pattern_boundaries():
    def f(x, b, c):
        shared = x + b              # also used outside the pattern: leaks, so not replaceable
        y = F.gelu(shared) + shared
        z = F.gelu(c + c)           # x + y must bind two different nodes: no match (as in torch)
        w = F.gelu(F.gelu(y + b) + b)   # two matches, the second reading the first's result
        return y, z, w
    gm = fx.symbolic_trace(f)
    assert len(find_matches(gm, bias_gelu)) == 2
    assert len(replace_pattern(gm, bias_gelu, bias_relu)) == 2
    x, b = torch.randn(3, 4), torch.randn(4)
    torch.testing.assert_close(gm(x, b, x)[2], torch.relu(torch.relu(f(x, b, x)[0] - b) - b))
    empty = fx.symbolic_trace(lambda x: x)
    assert replace_pattern(empty, bias_gelu, bias_relu) == [] and empty(x) is x
    # constants must agree in value and type: x * 2 does not match a * 2.0
    consts = fx.symbolic_trace(lambda a: (a * 2.0, a * 2))
    assert len(find_matches(consts, lambda t: t * 2)) == 1


@pytest.mark.parametrize("pattern, replacement, words", [
    (lambda x, y: (x + y, x * y), lambda x, y: x, "exactly one"),
    (lambda x: x, lambda x: x, "returns one of its inputs"),
    (bias_gelu, lambda x: x, "takes 1 inputs but the pattern has 2"),
])
def test_bad_patterns_are_refused(pattern, replacement, words):
    gm = fx.symbolic_trace(bias_gelu)
    with pytest.raises(ValueError, match=words):
        replace_pattern(gm, pattern, replacement)
    with pytest.raises(TypeError, match="GraphModule"):
        replace_pattern(gm.graph, bias_gelu, bias_relu)


def test_fuse_bias_gelu_in_a_dynamo_backend():
    from ptinternals.dispatch.custom_ops import fused_bias_gelu  # noqa: F401

    counts = []

    def backend(gm, example_inputs):
        counts.append(fuse_bias_gelu(gm))
        assert torch.ops.ptinternals.fused_bias_gelu.default in {n.target for n in gm.graph.nodes}
        return gm.forward

    def f(x, b, wide):
        y = F.gelu(x + b)                 # fused
        z = F.gelu(y + wide)              # wide is (3, 4): not a 1-D bias, left alone
        return z.sum(-1)
    x, b, wide = torch.randn(3, 4), torch.randn(4), torch.randn(3, 4)
    out = torch.compile(f, backend=backend, fullgraph=True)(x, b, wide)
    torch.testing.assert_close(out, f(x, b, wide))
    assert counts == [1]
    plain = fx.symbolic_trace(f)                # no shapes recorded: nothing is fused on a guess
    assert fuse_bias_gelu(plain) == 0


# --- dead code elimination --------------------------------------------------------------------------

@given(graph_specs())
def test_dce_matches_torch_on_pure_graphs(spec):
    ours, theirs = build_graph(spec), build_graph(spec)
    removed = eliminate_dead_code(ours)
    theirs.graph.eliminate_dead_code()
    theirs.recompile()
    assert ops_of(ours) == ops_of(theirs)
    assert len(removed) == len(list(build_graph(spec).graph.nodes)) - len(list(ours.graph.nodes))
    x, b = inputs()
    for got, want in zip(ours(x, b), build_graph(spec)(x, b)):
        torch.testing.assert_close(got, want)


def test_dce_keeps_effects_torch_would_drop():
    def f(x):
        unused = x * 3  # noqa: F841     dead: removed
        x.add_(1)                         # in-place method, no users: torch's DCE erases it
        torch.nn.functional.dropout(x, 0.5)   # random: consumes the generator
        return x.sin()
    gm = fx.symbolic_trace(f)
    assert eliminate_dead_code(gm) == ["mul"]
    kept = [n.target for n in gm.graph.nodes]
    assert "add_" in kept and F.dropout in kept
    x = torch.zeros(3)
    torch.testing.assert_close(gm(x.clone()), f(x.clone()))
    torch_gm = fx.symbolic_trace(f)
    torch_gm.graph.eliminate_dead_code()
    assert "add_" not in [n.target for n in torch_gm.graph.nodes]     # the difference, documented
    # an ATen mutating op (schema with Tensor(a!)) and a single-node graph
    g = fx.Graph()
    a = g.placeholder("a")
    g.call_function(torch.ops.aten.add_.Tensor, (a, a))
    g.output(a)
    gm2 = fx.GraphModule(torch.nn.Module(), g)
    assert eliminate_dead_code(gm2) == [] and is_impure(list(gm2.graph.nodes)[1])
    with pytest.raises(TypeError, match="GraphModule or Graph"):
        eliminate_dead_code(f)


# --- common subexpression elimination -----------------------------------------------------------------

def _aten_graph(fn, *args):
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(*args)


@given(graph_specs())
def test_cse_matches_torch_fx_graph_cse(spec):
    from torch._functorch.compile_utils import fx_graph_cse

    x, b = inputs()
    aten = _aten_graph(build_graph(spec), x, b)
    ours = eliminate_common_subexpressions(aten)
    theirs = fx_graph_cse(copy.deepcopy(aten).graph)
    assert [n.name for n in ours.graph.nodes] == [n.name for n in theirs.nodes]
    for got, want in zip(ours(x, b), aten(x, b)):
        torch.testing.assert_close(got, want)


def test_cse_keeps_random_ops_and_constant_types_apart():
    def f(x):
        return torch.rand_like(x) + torch.rand_like(x), x * 1, x * 1.0, x.sin() + x.sin()
    gm = eliminate_common_subexpressions(_aten_graph(f, torch.randn(3)))
    targets = [n.target for n in gm.graph.nodes]
    assert targets.count(torch.ops.aten.rand_like.default) == 2
    assert targets.count(torch.ops.aten.mul.Tensor) == 2
    assert targets.count(torch.ops.aten.sin.default) == 1


# --- shape propagation and the interpreter -------------------------------------------------------------

@given(graph_specs())
def test_shape_prop_matches_torch_shape_prop(spec):
    x, b = inputs()
    gm = build_graph(spec)
    ours = propagate_shapes(gm, x, b)
    fake = propagate_shapes(gm, x, b, fake=True)
    TorchShapeProp(gm).propagate(x, b)
    for n in gm.graph.nodes:
        if n.op == "output":
            continue
        tm = n.meta["tensor_meta"]
        assert ours[n.name] == TensorInfo(tuple(tm.shape), tm.dtype, tuple(tm.stride), tm.requires_grad)
        assert fake[n.name] == ours[n.name]


def test_shape_prop_boundaries():
    def f(x):
        return torch.split(x, 2, dim=1), x.t(), x[0, 0], x.size(0)
    gm = fx.symbolic_trace(f)
    shapes = propagate_shapes(gm, torch.randn(3, 5))
    assert [s.shape for s in shapes["split"]] == [(3, 2), (3, 2), (3, 1)]
    assert shapes["t"].stride == (1, 5) and shapes["getitem"].shape == ()
    assert shapes["size"] is None                                      # an int, not a tensor
    huge = fx.symbolic_trace(lambda x: x.sum(0))
    big = propagate_shapes(huge, torch.empty(2**20, 2**14, device="meta"), fake=True)   # 64 GiB, no data
    assert big["sum_1"].shape == (2**14,) and big["x"].nbytes == 2**34 * 4
    with pytest.raises(ValueError, match="2 inputs, got 1"):
        ShapeProp(fx.symbolic_trace(lambda a, c: a + c)).propagate(torch.ones(1))


def test_non_finite_locator_names_the_op_that_made_it():
    def f(x):
        y = x - 1
        z = y.log()                  # log of a negative number: NaN born here
        return (z * 2).exp()
    gm = fx.symbolic_trace(f)
    found = first_non_finite(gm, torch.tensor([0.5, 2.0]))
    assert found.node == "log" and found.op == "Tensor.log" and found.nan == 1 and found.inf == 0
    assert first_non_finite(gm, torch.tensor([3.0, 2.0])) is None
    assert first_non_finite(gm, torch.tensor([float("nan"), 2.0])) is None   # carried, not made
    mm = fx.symbolic_trace(lambda a: operator.truediv(a, 0.0))
    assert first_non_finite(mm, torch.ones(2)).inf == 2
