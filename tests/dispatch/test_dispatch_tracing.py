"""tracing.py against make_fx: same ATen ops, and the recorded graph replays to the same loss and grads."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from ptinternals.dispatch.tracing import AtenTracer, trace_forward_backward


def mlp(d_in, d_hidden, d_out):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_out))


def make_fx_ops(fn, *args) -> list[str]:
    return [str(n.target) for n in make_fx(fn)(*args).graph.nodes if n.op == "call_function"]


@settings(max_examples=10)  # make_fx costs ~0.1 s a call
@given(batch=st.sampled_from([1, 3, 7]), d=st.sampled_from([1, 4, 9]), hidden=st.sampled_from([2, 16]))
def test_forward_and_backward_ops_match_make_fx(batch, d, hidden):
    model = mlp(d, hidden, 3)
    x = torch.randn(batch, d, requires_grad=True)
    loss_fn = lambda x: model(x).pow(2).mean()  # noqa: E731
    graph = trace_forward_backward(loss_fn, x, params=dict(model.named_parameters()))

    def fwd_bwd(x):
        loss = loss_fn(x)
        return (loss, *torch.autograd.grad(loss, [x, *model.parameters()]))

    ours = [op for op in graph.op_names() if op != "aten.detach.default"]  # AccumulateGrad's detaches
    assert ours == make_fx_ops(fwd_bwd, x)
    assert graph.op_names("forward") == make_fx_ops(loss_fn, x)
    assert x.grad is None  # tracing left the user's .grad alone


@settings(max_examples=9)
@given(batch=st.sampled_from([1, 2, 5]), seq=st.sampled_from([1, 3, 8]))
def test_replay_reproduces_loss_and_grads(batch, seq):
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, batch_first=True, dropout=0.0)
    x = torch.randn(seq, batch, 8).transpose(0, 1).requires_grad_()  # a non-contiguous input
    params = dict(layer.named_parameters())
    graph = trace_forward_backward(lambda x: layer(x).sum(), x, params=params)
    out = graph.to_fx()(*graph.example_inputs())
    loss = layer(x).sum()
    grads = torch.autograd.grad(loss, [x, *params.values()])
    assert torch.allclose(out[0], loss, atol=1e-5)
    assert len(out) == 1 + len(grads)
    for ours, ref in zip(out[1:], grads, strict=True):
        assert torch.allclose(ours, ref, atol=1e-5)


def test_graph_prints_like_fx_and_handles_tuples_and_inplace():
    x = torch.randn(4, 6, requires_grad=True)
    w = torch.randn(6)

    def fn(x):
        y = F.layer_norm(x, (6,), w)   # native_layer_norm returns a tuple: getitem refs
        z = y + 1
        z.mul_(2)                     # in place: later uses point at the mul_ node
        return z.sum()

    graph = trace_forward_backward(fn, x)
    text = str(graph)
    assert "%x : f32[4, 6] = placeholder[target=x]" in text
    assert "aten.native_layer_norm.default(%x, [6], %const" in text
    assert "%mul_ : f32[4, 6] = aten.mul_.Tensor(%add, 2)" in text
    assert "aten.sum.default(%mul_)" in text
    assert "# --- backward ---" in text
    out = graph.to_fx()(*graph.example_inputs())
    x2 = x.detach().requires_grad_()
    fn(x2).backward()
    assert torch.allclose(out[1], x2.grad)


def test_tracer_records_inputs_and_constants():
    a, b = torch.randn(3), torch.randn(3)
    with AtenTracer() as tr:
        tr.input(a, "a")
        c = a + b        # b was never named: a constant placeholder
        tr.output(c)
    names = [n.name for n in tr.graph.placeholders()]
    assert names == ["a", "const"] and torch.equal(tr.graph.constants["const"], b)
    assert torch.equal(tr.graph.to_fx()(a, b)[0], a + b)


def test_invalid_inputs():
    with pytest.raises(TypeError, match="callable"):
        trace_forward_backward(3, torch.randn(2))
    with pytest.raises(ValueError, match="scalar"):
        trace_forward_backward(lambda x: x * 2, torch.randn(2, requires_grad=True))
    with pytest.raises(TypeError, match=r"inputs\[0\]"):
        trace_forward_backward(lambda x: x.sum(), [1.0])
    with pytest.raises(ValueError, match="names has"):
        trace_forward_backward(lambda x: x.sum(), torch.randn(2), names=["a", "b"])
    with AtenTracer() as tr:
        with pytest.raises(ValueError, match="identifier"):
            tr.input(torch.randn(1), "not an identifier")
        with pytest.raises(TypeError, match="must be a tensor"):
            tr.input(1.0, "x")
