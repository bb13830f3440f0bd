"""QuantizedTensor: quantisation error, native ops vs dequantised reference, a full training step."""
import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

from ptinternals.dispatch.dispatcher import TensorDesc, predict_dispatch
from ptinternals.dispatch.quantized import QMAX, QuantizedTensor, quantize_linear_weights

dims = st.sampled_from([1, 2, 3, 7, 16])


@given(rows=dims, cols=dims, axis=st.sampled_from([None, 0, 1]), zero_row=st.booleans(),
       seed=st.integers(0, 99))
def test_quantisation_error_is_at_most_half_a_step(rows, cols, axis, zero_row, seed):
    torch.manual_seed(seed)
    w = torch.randn(rows, cols) * 3
    if zero_row:
        w[0] = 0  # an all-zero channel must not divide by zero
    q = QuantizedTensor.quantize(w, axis=axis)
    assert q.int_data.dtype == torch.int8 and q.int_data.abs().max() <= QMAX
    assert q.shape == w.shape and q.dtype == torch.float32 and not q.requires_grad
    step = q.scale if axis is None else q.scale.reshape([-1 if d == axis else 1 for d in range(2)])
    assert torch.all((q.dequantize() - w).abs() <= step / 2 + 1e-6)
    assert torch.isfinite(q.dequantize()).all()


@given(m=dims, k=dims, n=dims, axis=st.sampled_from([None, 0, 1]), bias=st.booleans())
def test_mm_and_addmm_dequantise_in_kernel(m, k, n, axis, bias):
    torch.manual_seed(0)
    x, w = torch.randn(m, k), torch.randn(n, k)
    qw = QuantizedTensor.quantize(w, axis=axis)  # [n, k]; the mm uses its transpose [k, n]
    ref_w = qw.dequantize()
    qt = qw.t()
    assert isinstance(qt, QuantizedTensor) and qt.axis == (None if axis is None else 1 - axis)
    assert torch.equal(qt.int_data, qw.int_data.t())  # metadata only: the same int8 storage
    assert qt.int_data.data_ptr() == qw.int_data.data_ptr()
    if bias:
        b = torch.randn(n)
        out, ref = torch.addmm(b, x, qt), torch.addmm(b, x, ref_w.t())
    else:
        out, ref = torch.mm(x, qt), torch.mm(x, ref_w.t())
    assert type(out) is torch.Tensor
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_metadata_ops_and_fallback():
    torch.manual_seed(0)
    w = torch.randn(4, 6)
    q = QuantizedTensor.quantize(w, axis=None)
    v = q.view(2, 12)
    assert isinstance(v, QuantizedTensor) and v.shape == (2, 12)
    assert isinstance(q.detach(), QuantizedTensor) and isinstance(q.transpose(0, 1), QuantizedTensor)
    torch.testing.assert_close(q.transpose(0, 1).dequantize(), q.dequantize().t())
    pc = QuantizedTensor.quantize(w, axis=0)
    s = pc.sum(dim=1)  # unsupported op: dequantise, then run it
    assert type(s) is torch.Tensor
    torch.testing.assert_close(s, pc.dequantize().sum(dim=1))
    torch.testing.assert_close(pc.view(24), pc.dequantize().view(24))  # per-channel view: fallback
    torch.testing.assert_close(pc * 2, pc.dequantize() * 2)
    with pytest.raises(NotImplementedError, match="in-place"):
        pc.add_(1)
    assert "per-channel(axis=0)" in repr(pc)


def test_a_quantised_tensor_goes_through_the_python_key():
    q = QuantizedTensor.quantize(torch.randn(3, 3))
    desc = TensorDesc.from_tensor(q)
    assert desc.subclass == "wrapper"
    path = predict_dispatch("aten::mm", torch.randn(3, 3), q)
    assert path == ["PythonTLSSnapshot", "AutogradCPU", "Python", "CPU"]


def build(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.LayerNorm(8), nn.Linear(8, 3))


@settings(max_examples=10)
@given(batch=st.sampled_from([1, 4, 5]), three_d=st.booleans())
def test_training_step_matches_dequantised_reference(batch, three_d):
    model, ref = build(), build()
    assert quantize_linear_weights(model) == 2
    for m, r in zip(model, ref, strict=True):  # the reference holds the dequantised weights, also frozen
        if isinstance(m, nn.Linear):
            r.weight = nn.Parameter(m.weight.dequantize(), requires_grad=False)
    shape = (2, batch, 6) if three_d else (batch, 6)
    x = torch.randn(shape)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    opt_ref = torch.optim.AdamW([p for p in ref.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):  # forward, backward, optimiser step - twice
        loss, loss_ref = model(x).pow(2).mean(), ref(x).pow(2).mean()
        loss.backward()
        loss_ref.backward()
        for (name, p), p_ref in zip(model.named_parameters(), ref.parameters(), strict=True):
            if p.requires_grad:
                torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-4, atol=1e-5, msg=name)
        opt.step()
        opt_ref.step()
        opt.zero_grad()
        opt_ref.zero_grad()
        torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-6)
    assert isinstance(model[0].weight, QuantizedTensor) and model[0].weight.grad is None  # frozen int8


def test_input_gradient_flows_through_the_quantised_weight():
    model = build()
    quantize_linear_weights(model)
    x = torch.randn(3, 6, requires_grad=True)
    model(x).sum().backward()
    x_ref = x.detach().requires_grad_()
    w = [m.weight.dequantize() if isinstance(m, nn.Linear) else None for m in model]
    h = torch.nn.functional.linear(x_ref, w[0], model[0].bias).relu()
    torch.nn.functional.linear(model[2](h), w[3], model[3].bias).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-5, atol=1e-6)


def test_compiles_with_fullgraph():
    model = build()
    quantize_linear_weights(model)
    x = torch.randn(4, 6)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), model(x))


def test_invalid_inputs():
    with pytest.raises(TypeError, match="int8"):
        QuantizedTensor(torch.zeros(2, 2), torch.ones(()))
    with pytest.raises(ValueError, match="per-tensor scale"):
        QuantizedTensor(torch.zeros(2, 2, dtype=torch.int8), torch.ones(2))
    with pytest.raises(ValueError, match="per-channel scale must have shape"):
        QuantizedTensor(torch.zeros(2, 3, dtype=torch.int8), torch.ones(3), axis=0)
    with pytest.raises(IndexError, match="axis"):
        QuantizedTensor(torch.zeros(2, 3, dtype=torch.int8), torch.ones(2), axis=2)
    with pytest.raises(TypeError, match="floating-point"):
        QuantizedTensor.quantize(torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(IndexError, match="axis"):
        QuantizedTensor.quantize(torch.zeros(2, 2), axis=-1)
    with pytest.raises(TypeError, match="logical dtype"):
        QuantizedTensor(torch.zeros(2, dtype=torch.int8), torch.ones(()), dtype=torch.int32)
    with pytest.raises(TypeError, match="nn.Module"):
        quantize_linear_weights("model")


@pytest.mark.gpu
def test_training_step_on_cuda():
    model = build().cuda()
    quantize_linear_weights(model)
    assert model[0].weight.int_data.is_cuda
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    x = torch.randn(16, 6, device="cuda")
    losses = []
    for _ in range(5):
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
