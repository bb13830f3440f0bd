"""The reference functions that mirror the chapter's exercises one for one (the notebook's ``# twin:`` lines):
their own contracts against real torch and their errors on bad input. The shared test
``test_reference_twin_passes_the_hidden_cases`` runs each through its exercise's hidden cases."""
import pytest
import torch
import torch.nn as nn
from hypothesis import given
from hypothesis import strategies as st

from ptinternals.checks.dispatch import real_key_names, torch_int8
from ptinternals.dispatch.dispatcher import dispatch_path
from ptinternals.dispatch.fake_memory import estimate_memory
from ptinternals.dispatch.keys import tensor_keys
from ptinternals.dispatch.quantized import Int8Tensor
from ptinternals.dispatch.recorded_path import record_dispatch_path
from ptinternals.dispatch.tracing import GraphTracer


@given(device=st.sampled_from(["cpu", "meta"]), inference=st.booleans(), conj=st.booleans(),
       functional=st.booleans())
def test_tensor_keys_are_torchs(device, inference, conj, functional):
    desc = {"device": device, "inference": inference, "conj": conj, "functional": functional}
    assert tensor_keys(**desc) == sorted(real_key_names(**desc))


def test_tensor_keys_rejects_an_unknown_subclass_or_device():
    with pytest.raises(ValueError, match="subclass"):
        tensor_keys("cpu", subclass="proxy")
    with pytest.raises(ValueError, match="device"):
        tensor_keys("tpu")


def test_dispatch_path_is_the_probes_path_without_the_tls_snapshot():
    cpu, wrapper = {"device": "cpu"}, {"device": "cpu", "subclass": "wrapper"}
    ft = ["ADInplaceOrView", "BackendSelect"]
    for tensors, ctx in [([cpu, cpu], {}), ([wrapper, cpu], {"modes": ["python"]}),
                         ([cpu, cpu], {"autocast": "cpu", "modes": ["python", "python"]})]:
        assert dispatch_path(tensors, fallthrough=ft, **ctx) == record_dispatch_path("probe", *tensors, **ctx)


def test_dispatch_path_rejects_a_string_of_fallthrough_keys():
    with pytest.raises(TypeError, match="fallthrough"):
        dispatch_path([{"device": "cpu"}], fallthrough="BackendSelect")


def test_int8_tensor_quantizes_like_torch_and_keeps_zero_rows_at_scale_zero():
    w = torch.tensor([[127.0, 0.5, 1.5, 2.5, -2.5], [0.0, 0.0, 0.0, 0.0, 0.0], [3.0, -1.0, 0.25, 2.0, 1.0]])
    q = Int8Tensor.quantize(w)
    want, scale = torch_int8(w)
    assert torch.equal(q.int_data, want) and torch.equal(q.scale, scale)
    assert q.int_data[0].tolist() == [127, 0, 2, 2, -2]  # exact ties round half to even
    assert type(nn.Parameter(q, requires_grad=False)).__name__ == "Int8Tensor"  # detach keeps the class
    with pytest.raises(TypeError, match="2-d"):
        Int8Tensor.quantize(torch.ones(3))


def test_estimate_memory_keeps_the_models_dtype_and_rounds_only_for_cuda():
    def model_fn():
        return nn.Sequential(nn.Linear(3, 5, dtype=torch.bfloat16), nn.GELU(), nn.Linear(5, 2, dtype=torch.bfloat16))

    cpu, cuda = estimate_memory(model_fn, (4, 3), torch.bfloat16, "cpu"), estimate_memory(model_fn, (4, 3),
                                                                                           torch.bfloat16, "cuda")
    assert cpu["parameters"] == 2 * (3 * 5 + 5 + 5 * 2 + 2) and cpu["output_shape"] == (4, 2)
    assert cuda["parameters"] == 4 * 512 and cuda["optimizer_state"] == 2 * cuda["gradients"]
    with pytest.raises(TypeError, match="input_dtype"):
        estimate_memory(model_fn, (4, 3), "float32")


def test_graph_tracer_nodes_name_constants_and_outputs():
    x = torch.randn(3, 2, requires_grad=True)
    mask = torch.tensor([1.0, 0.0])
    tracer = GraphTracer()
    tracer.placeholder(x, "x")
    with tracer:
        loss = (x * mask).sum()
        loss.backward()
    tracer.output(loss, x.grad)
    kinds = [n[1] if isinstance(n[1], str) else "op" for n in tracer.nodes]
    assert kinds[0] == "placeholder" and "constant" in kinds and kinds[-1] == "output"
    const = next(n for n in tracer.nodes if n[1] == "constant")
    assert torch.equal(const[2][0], mask)
