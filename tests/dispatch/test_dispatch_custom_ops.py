"""ptinternals::fused_bias_gelu: numerics, fake and autograd registrations, opcheck, torch.compile."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from ptinternals.dispatch.custom_ops import define_fused_bias_gelu, fused_bias_gelu, gelu_grad
from ptinternals.dispatch.dispatcher import predict_dispatch
from ptinternals.dispatch.operator_entry import dispatch_table_from_torch

shapes = st.sampled_from([(0, 3), (1, 1), (5,), (3, 7), (2, 3, 17), (4, 1, 8)])


@given(shape=shapes, dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
       transpose=st.booleans())
def test_forward_matches_torch_gelu(shape, dtype, transpose):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype)
    if transpose and x.dim() >= 2:
        x = x.transpose(0, -1).contiguous().transpose(0, -1)  # non-contiguous input, same shape
    b = torch.randn(shape[-1], dtype=dtype)
    out = torch.ops.ptinternals.fused_bias_gelu(x, b)
    tol = dict(rtol=1.6e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out, F.gelu(x + b), **tol)


@given(shape=shapes)
def test_backward_matches_torch_gelu(shape):
    torch.manual_seed(1)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    b = torch.randn(shape[-1], dtype=torch.float64, requires_grad=True)
    g = torch.randn(shape, dtype=torch.float64)
    gx, gb = torch.autograd.grad(fused_bias_gelu(x, b), [x, b], g)
    rx, rb = torch.autograd.grad(F.gelu(x + b), [x, b], g)
    torch.testing.assert_close(gx, rx)
    torch.testing.assert_close(gb, rb)
    z = torch.linspace(-4, 4, 9, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(gelu_grad(z), torch.autograd.grad(F.gelu(z).sum(), z)[0])


def test_gradcheck_and_opcheck():
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fused_bias_gelu, (x, b))
    results = torch.library.opcheck(fused_bias_gelu, (x, b))
    assert set(results.values()) == {"SUCCESS"}, results


def test_fake_kernel_gives_shapes_without_data():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, b = torch.empty(1024, 4096, device="cuda", dtype=torch.bfloat16), torch.empty(4096, device="cuda",
                                                                                         dtype=torch.bfloat16)
        out = fused_bias_gelu(x, b)
        assert out.shape == (1024, 4096) and out.device.type == "cuda" and out.dtype == torch.bfloat16
        with pytest.raises(ValueError, match="bias must have shape"):
            fused_bias_gelu(x, torch.empty(3, device="cuda", dtype=torch.bfloat16))


def test_compile_fullgraph_has_no_graph_break():
    def f(x, b):
        return fused_bias_gelu(x @ x.t(), b).sum(-1) * 2

    x, b = torch.randn(4, 4), torch.randn(4)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, b), f(x, b))
    explanation = torch._dynamo.explain(f)(x, b)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


@pytest.mark.slow
def test_compile_with_inductor():
    """One inductor compile (~16 s cold on a laptop CPU); the op stays an opaque call in the code."""
    x, b = torch.randn(8, 16, requires_grad=True), torch.randn(16, requires_grad=True)
    compiled = torch.compile(lambda x, b: fused_bias_gelu(x, b).sum(), fullgraph=True)
    out = compiled(x, b)
    out.backward()
    torch.testing.assert_close(out, F.gelu(x + b).sum())
    torch.testing.assert_close(x.grad, torch.autograd.grad(F.gelu(x + b).sum(), x)[0])


def test_dispatcher_view_of_the_custom_op():
    table = dispatch_table_from_torch("ptinternals::fused_bias_gelu")
    assert table["CPU"].kind == table["CUDA"].kind == "default backend kernel"  # CompositeExplicitAutograd
    assert table["AutogradCPU"].kind == "autograd kernel"  # register_autograd -> the Autograd alias
    assert table["Meta"].kind == "kernel"                    # register_fake -> Meta
    assert predict_dispatch("ptinternals::fused_bias_gelu", "cpu", "cpu") == ["AutogradCPU", "CPU"]


def test_redefinition_and_other_namespaces():
    student = define_fused_bias_gelu("ptinternals_student")
    again = define_fused_bias_gelu("ptinternals_student")  # re-running a notebook cell: replaces, no error
    x, b = torch.randn(2, 3), torch.randn(3)
    torch.testing.assert_close(again(x, b), fused_bias_gelu(x, b))
    torch.testing.assert_close(torch.ops.ptinternals_student.fused_bias_gelu(x, b), student(x, b))
    with pytest.raises(ValueError, match="namespace"):
        define_fused_bias_gelu("not valid")


def test_invalid_inputs():
    with pytest.raises(ValueError, match="bias must have shape"):
        fused_bias_gelu(torch.randn(2, 3), torch.randn(4))
    with pytest.raises(ValueError, match="share dtype"):
        fused_bias_gelu(torch.randn(2, 3), torch.randn(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="floating point"):
        fused_bias_gelu(torch.ones(2, 3, dtype=torch.int64), torch.ones(3, dtype=torch.int64))


@pytest.mark.gpu
def test_opcheck_and_compile_on_cuda():
    x = torch.randn(64, 128, device="cuda", dtype=torch.float32, requires_grad=True)
    b = torch.randn(128, device="cuda", requires_grad=True)
    assert set(torch.library.opcheck(fused_bias_gelu, (x, b)).values()) == {"SUCCESS"}
    compiled = torch.compile(lambda x, b: fused_bias_gelu(x, b), backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, b), F.gelu(x + b))


def test_fake_layout_check_compares_significant_strides_on_every_torch():
    """The course's own fake-vs-real check (opcheck compares CPU strides only from torch 2.13 on)."""
    from ptinternals.checks.dispatch import layout_problem

    def layout(shape, real, fake, dtypes=("float32", "float32")):
        return {"real": [list(shape), list(real), dtypes[0]], "fake": [list(shape), list(fake), dtypes[1]]}

    assert layout_problem(layout((4, 3), (1, 4), (1, 4)), (4, 3)) is None
    assert "strides included" in layout_problem(layout((4, 3), (1, 4), (3, 1)), (4, 3))
    assert "dim 0" in layout_problem(layout((4, 3), (1, 4), (3, 1)), (4, 3))
    assert layout_problem(layout((4, 1), (1, 4), (1, 1)), (4, 1)) is None     # a size-1 dim's stride: free
    assert layout_problem(layout((0, 3), (1, 0), (3, 1)), (0, 3)) is None     # an empty result: any strides
    assert "dtype float64" in layout_problem(layout((2,), (1,), (1,), ("float32", "float64")), (2,))
    assert "RuntimeError" in layout_problem({"real": [[2], [1], "float32"], "fake": "RuntimeError: no"}, (2,))
    assert "could not read" in layout_problem({"real": [[2], [1], "float32"], "fake": [[2], ["1"], "float32"]}, (2,))
    assert "could not read" in layout_problem(None, (2,))
