"""The layer-norm kernel as a torch.library custom op (the kernels chapter, exercise "custom op")."""
import pytest
import torch
import torch.nn.functional as F

from ptinternals.kernels.custom_op import (
    TritonLayerNorm,
    layer_norm_backward_op,
    layer_norm_op,
    triton_layer_norm,
)

from .kernels_testing import DEVICE, assert_close


def _inputs(shape, dtype=torch.float32, seed=0, transposed=False):
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g, dtype=dtype, device="cpu").to(DEVICE)
    x = rand(*(shape if not transposed else shape[::-1]))
    x = (x.t() if transposed else x).requires_grad_()
    n = shape[-1]
    w, b = rand(n).requires_grad_(), rand(n).requires_grad_()
    return x, w, b


def test_it_is_a_registered_operator():
    assert torch.ops.ptinternals.triton_layer_norm.default is not None
    schema = str(torch.ops.ptinternals.triton_layer_norm.default._schema)
    assert "float eps" in schema and "-> (Tensor, Tensor, Tensor)" in schema


@pytest.mark.parametrize("shape, dtype, transposed", [((7, 40), torch.float32, False),
                                                      ((2, 3, 24), torch.float64, False),
                                                      ((9, 16), torch.float32, True)])
def test_opcheck_passes(shape, dtype, transposed):
    x, w, b = _inputs(shape, dtype, transposed=transposed)
    result = torch.library.opcheck(layer_norm_op, (x, w, b, 1e-5))
    assert all(v == "SUCCESS" for v in result.values()), result


def test_opcheck_backward_op():
    x, w, _ = (t.detach() for t in _inputs((5, 24)))
    _, mean, rstd = layer_norm_op(x, w, torch.zeros(24), 1e-5)
    result = torch.library.opcheck(layer_norm_backward_op, (torch.randn(5, 24), x, w, mean, rstd))
    assert all(v == "SUCCESS" for v in result.values()), result


def test_gradcheck_fp64():
    x, w, b = _inputs((3, 8), torch.float64, seed=1)
    assert torch.autograd.gradcheck(lambda x, w, b: triton_layer_norm(x, w, b), (x, w, b), fast_mode=True)


def test_fake_tensor_shapes_match_real():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        y, mean, rstd = layer_norm_op(torch.empty(4, 6, 10), torch.empty(10), torch.empty(10), 1e-5)
    assert y.shape == (4, 6, 10) and mean.shape == (4, 6) and rstd.dtype == torch.float32


def test_a_small_model_trains_like_nn_layernorm():
    """Same init, same data: the loss curve through the custom op equals nn.LayerNorm's."""
    def model(norm):
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(12, 32), norm, torch.nn.GELU(), torch.nn.Linear(32, 1))

    ours, ref = model(TritonLayerNorm(32)), model(torch.nn.LayerNorm(32))
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randn(*s, generator=g, device="cpu").to(DEVICE) for s in ((64, 12), (64, 1)))
    losses = {}
    for name, net in (("ours", ours), ("ref", ref)):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        losses[name] = []
        for _ in range(6):
            loss = F.mse_loss(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[name].append(loss.item())
    assert losses["ours"][-1] < losses["ours"][0], f"loss did not go down: {losses['ours']}"
    curve, ref_curve = torch.tensor(losses["ours"]), torch.tensor(losses["ref"])
    assert_close(curve, ref_curve, torch.float32, "loss curve", scale=10)
    assert_close(ours[1].weight, ref[1].weight, torch.float32, "trained LayerNorm weight", scale=10)


def test_module_rejects_bad_shape():
    with pytest.raises(ValueError, match="normalized_shape"):
        TritonLayerNorm(0)


@pytest.mark.gpu
def test_custom_op_gpu_bf16_and_compile():
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.zeros(256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    result = torch.library.opcheck(layer_norm_op, (x, w, b, 1e-5))
    assert all(v == "SUCCESS" for v in result.values()), result
    fn = torch.compile(lambda x: triton_layer_norm(x, w, b), fullgraph=True)
    want = F.layer_norm(x.float(), (256,), w.float(), b.float())
    torch.testing.assert_close(fn(x).float(), want, atol=3e-2, rtol=0)


def test_a_second_namespace_defines_a_second_copy():
    from ptinternals.kernels.custom_op import define_triton_layer_norm

    op, _ = define_triton_layer_norm("ptinternals_kernels_test")
    x, w, b = (t.detach() for t in _inputs((4, 12)))
    y = torch.ops.ptinternals_kernels_test.triton_layer_norm(x, w, b, 1e-5)[0]
    assert_close(y, F.layer_norm(x, (12,), w, b), torch.float32, "second copy")
    with pytest.raises(ValueError, match="namespace"):
        define_triton_layer_norm("not an identifier")
