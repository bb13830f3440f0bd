"""predict_dispatch against the real dispatcher: probe ops log the keys that ran; aten ops show effects."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from ptinternals.dispatch.dispatcher import DispatchError, TensorDesc, explain_dispatch, predict_dispatch
from ptinternals.dispatch.recorded_path import NAMESPACE, probe_op, record_dispatch_path, record_dispatch_steps

# PythonTLSSnapshot and the Functionalize fallback are C++ fallbacks the probes cannot log.
UNLOGGED = ("PythonTLSSnapshot", "Functionalize")

DESCS = st.sampled_from([
    dict(device="cpu"), dict(device="meta"), dict(device="cpu", requires_grad=True),
    dict(device="cpu", inference=True), dict(device="meta", inference=True),
    dict(device="cpu", subclass="wrapper"), dict(device="meta", subclass="wrapper"),
    dict(device="cpu", functional=True),
])
CONTEXTS = st.fixed_dictionaries({}, optional={
    "grad_mode": st.just(False), "inference_mode": st.just(True), "autocast": st.just("cpu"),
    "modes": st.sampled_from([["python"], ["python", "python"]])})


def predicted(name, *descs, **ctx):
    probe_op(name)  # defines the probes on first use
    return [k for k in predict_dispatch(f"{NAMESPACE}::{name}", *descs, **ctx) if k not in UNLOGGED]


@given(a=DESCS, b=DESCS, ctx=CONTEXTS, inplace=st.booleans())
def test_probe_paths_match_the_real_dispatcher(a, b, ctx, inplace):
    name = "probe_" if inplace else "probe"
    b = dict(b, device=a["device"])  # one device per call: mixed cpu/meta kernels would fail inside
    if inplace and (a.get("functional") or b.get("functional")):
        inplace, name = False, "probe"  # functionalization rejects custom in-place ops outright
    assert predicted(name, a, b, **ctx) == record_dispatch_path(name, a, b, **ctx)


@given(a=DESCS, ctx=CONTEXTS, inplace=st.booleans())
def test_probe_kernels_receive_the_predicted_key_sets(a, ctx, inplace):
    """Each probe kernel gets the dispatcher's key set (after TLS and fallthrough masking, narrowed by
    every redispatch): it must equal the model's, step by step."""
    name = "probe_" if inplace and not a.get("functional") else "probe"
    probe_op(name)
    ours = [(s.key, s.key_set) for s in explain_dispatch(f"{NAMESPACE}::{name}", a, a, **ctx)
            if s.key not in UNLOGGED]
    real = record_dispatch_steps(name, a, a, **ctx)
    assert [k for k, _ in ours] == [k for k, _ in real]
    for (key, our_ks), (_, real_ks) in zip(ours, real, strict=True):
        if real_ks is not None:  # Python steps are logged by the modes, without a key set
            assert our_ks == real_ks, key


@given(device=st.sampled_from(["cpu", "cuda"]), ctx=CONTEXTS, extra_mode=st.booleans())
def test_probe_paths_under_fake_tensor_mode(device, ctx, extra_mode):
    ctx = dict(ctx)
    ctx["modes"] = ["fake"] + (["python"] if extra_mode else [])
    d = dict(device=device, subclass="fake")
    assert predicted("probe", d, d, **ctx) == record_dispatch_path("probe", d, d, **ctx)
    assert predict_dispatch(f"{NAMESPACE}::probe", d, d, **ctx)[-1] == "Meta"  # fake cuda: the meta kernel


@pytest.mark.parametrize("device", [None, "cpu", "meta"])
@pytest.mark.parametrize("modes", [[], ["python"]])
def test_factory_probe_goes_through_backend_select(device, modes):
    ours = predicted("probe_factory", factory_device=device, modes=modes)
    assert ours == record_dispatch_path("probe_factory", factory_device=device, modes=modes)
    assert ours[-2:] == ["BackendSelect", "Meta" if device == "meta" else "CPU"]


def test_textbook_paths():
    add = "aten::add.Tensor"
    assert predict_dispatch(add, "cpu", "cpu") == ["AutogradCPU", "CPU"]
    assert predict_dispatch(add, "cpu", "cpu", grad_mode=False) == ["AutogradCPU", "CPU"]  # still runs
    assert predict_dispatch(add, "cpu", "cpu", inference_mode=True) == ["CPU"]
    assert predict_dispatch("aten::add_.Tensor", "cpu", "cpu") == ["AutogradCPU", "ADInplaceOrView", "CPU"]
    assert predict_dispatch("aten::matmul", "cpu", "cpu") == ["AutogradCPU"]  # decomposes at autograd
    assert predict_dispatch("aten::mm", "cpu", "cpu", autocast="cpu") == ["AutocastCPU", "AutogradCPU", "CPU"]
    assert predict_dispatch("aten::empty.memory_format", factory_device="meta") == ["BackendSelect", "Meta"]
    fake = dict(device="cuda", subclass="fake")
    in_mode = predict_dispatch(add, fake, fake, modes=["fake"])
    assert in_mode == ["PythonTLSSnapshot", "AutogradCUDA", "Python", "Meta"]
    # a FakeTensor outside its mode: its __torch_dispatch__ re-enters the mode, a second Python step
    assert predict_dispatch(add, fake, fake) == in_mode[:2] + ["Python", "Python", "Meta"]
    steps = explain_dispatch(add, "cpu", "cpu", modes=1)
    assert [s.key for s in steps] == ["PythonTLSSnapshot", "AutogradCPU", "Python", "CPU"]
    assert steps[1].key_set == "DispatchKeySet(CPU, Python, AutogradCPU)"
    assert steps[-1].kind == "kernel"


class SeenOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(func._schema.name)  # "aten::add"
        return func(*args, **(kwargs or {}))


ATEN_CALLS = {
    "aten::add.Tensor": lambda a, b: torch.add(a, b),
    "aten::mm": lambda a, b: torch.mm(a, b),
    "aten::matmul": lambda a, b: torch.matmul(a, b),
    "aten::mul.Tensor": lambda a, b: torch.mul(a, b),
    "aten::linear": lambda a, b: torch.nn.functional.linear(a, b),
}


@given(op=st.sampled_from(sorted(ATEN_CALLS)), inference=st.booleans(), autocast=st.booleans(),
       requires_grad=st.booleans())
def test_aten_effects_follow_the_predicted_path(op, inference, autocast, requires_grad):
    """Three visible consequences of the path on real aten ops: a mode sees the op iff 'Python' is on its
    path; the output has a grad_fn iff an autograd kernel ran with grad on; autocast casts iff
    'AutocastCPU' ran."""
    a = torch.randn(4, 4, requires_grad=requires_grad)
    b = torch.randn(4, 4)
    ctx = dict(inference_mode=inference, autocast="cpu" if autocast else None)
    steps = explain_dispatch(op, a, b, modes=1, **ctx)
    keys = [s.key for s in steps]
    mode = SeenOps()
    with torch.inference_mode(inference), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), mode:
        out = ATEN_CALLS[op](a, b)
    assert ("Python" in keys) == (op.split(".")[0] in mode.seen)
    autograd_ran = any(s.key == "AutogradCPU" and s.kind == "autograd kernel" for s in steps)
    decomposed = any(s.kind == "math kernel" for s in steps)
    if not decomposed:
        assert (out.grad_fn is not None) == (autograd_ran and requires_grad)
    if "AutocastCPU" in keys:
        assert out.dtype == torch.bfloat16
    elif not decomposed:
        assert out.dtype == torch.float32


def test_missing_kernel_error_matches_torch():
    lib = torch.library.Library("ptinternals_test_missing", "FRAGMENT")
    try:
        lib.define("only_meta(Tensor self) -> Tensor")
        lib.impl("only_meta", lambda x: torch.empty_like(x), "Meta")
        with pytest.raises(NotImplementedError) as real:
            torch.ops.ptinternals_test_missing.only_meta(torch.zeros(2))
        with pytest.raises(DispatchError) as ours:
            predict_dispatch("ptinternals_test_missing::only_meta", "cpu")
        first = lambda e: str(e.value).split(". ")[0]  # noqa: E731
        assert first(ours) == first(real) == ("Could not run 'ptinternals_test_missing::only_meta' "
                                              "with arguments from the 'CPU' backend")
        lib.define("only_cpu(Tensor self) -> Tensor")
        lib.impl("only_cpu", lambda x: x.clone(), "CPU")
        with pytest.raises(NotImplementedError, match="no fake impl or Meta kernel"):
            torch.ops.ptinternals_test_missing.only_cpu(torch.zeros(2, device="meta"))
        with pytest.raises(DispatchError, match="no fake impl or Meta kernel"):
            predict_dispatch("ptinternals_test_missing::only_cpu", "meta")
    finally:
        lib._destroy()


def test_tensor_desc_from_real_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    assert TensorDesc.from_tensor(torch.zeros(1, requires_grad=True)) == TensorDesc("cpu", requires_grad=True)
    with torch.inference_mode():
        assert TensorDesc.from_tensor(torch.zeros(1)).inference
    with FakeTensorMode():
        assert TensorDesc.from_tensor(torch.zeros(1, device="cuda")) == TensorDesc("cuda", subclass="fake")
    assert TensorDesc.from_tensor(torch._to_functional_tensor(torch.zeros(1))).functional
    assert predict_dispatch("aten::add.Tensor", torch.zeros(1), torch.zeros(1)) == ["AutogradCPU", "CPU"]


def test_invalid_inputs():
    with pytest.raises(ValueError, match="qualified"):
        predict_dispatch("add.Tensor", "cpu")
    with pytest.raises(ValueError, match="modes entries"):
        predict_dispatch("aten::add.Tensor", "cpu", modes=["functorch"])
    with pytest.raises(TypeError, match="modes must be"):
        predict_dispatch("aten::add.Tensor", "cpu", modes=2.5)
    with pytest.raises(TypeError, match=r"tensors\[1\] must be"):
        predict_dispatch("aten::add.Tensor", "cpu", 3)
    with pytest.raises(ValueError, match="unknown fields"):
        predict_dispatch("aten::add.Tensor", {"device": "cpu", "layout": "strided"})
    with pytest.raises(ValueError, match="subclass"):
        TensorDesc(subclass="nested")
    with pytest.raises(ValueError, match="no dispatch backend"):
        TensorDesc(device="gpu")
    with pytest.raises(ValueError, match="FakeTensorMode needs FakeTensor"):
        predict_dispatch("aten::add.Tensor", "cpu", "cpu", modes=["fake"])
    with pytest.raises(TypeError, match="table must be"):
        predict_dispatch("aten::add.Tensor", "cpu", table=[("CPU", "kernel")])
    with pytest.raises(ValueError, match="not a runtime dispatch key"):
        predict_dispatch("aten::add.Tensor", "cpu", table={"GPU": "kernel"})
    with pytest.raises(ValueError, match="not registered"):
        predict_dispatch("aten::add", "cpu")  # add has no default overload
    with pytest.raises(TypeError, match="inference_mode"):
        predict_dispatch("aten::add.Tensor", "cpu", inference_mode="yes")


def test_plain_data_tables():
    """The exercise form: the table as {key: kind}, no torch needed."""
    table = {"CPU": "kernel", "AutogradCPU": "autograd kernel", "ADInplaceOrView": "fallthrough",
             "BackendSelect": "fallthrough", "AutocastCPU": "fallthrough", "Python": "backend fallback",
             "PythonTLSSnapshot": "backend fallback"}
    assert predict_dispatch("my::op", "cpu", table=table) == ["AutogradCPU", "CPU"]
    assert predict_dispatch("my::op", "cpu", table=table, modes=1) == ["PythonTLSSnapshot", "AutogradCPU",
                                                                       "Python", "CPU"]
    with pytest.raises(DispatchError, match="'Meta' backend"):
        predict_dispatch("my::op", "meta", table={**table, "AutogradMeta": "autograd kernel"})


def test_probe_invalid_inputs():
    with pytest.raises(ValueError, match="name must be one of"):
        probe_op("add")
    with pytest.raises(ValueError, match="modes entries"):
        record_dispatch_path("probe", "cpu", "cpu", modes=["functorch"])
    with pytest.raises(ValueError, match="unknown tensor description fields"):
        record_dispatch_path("probe", {"layout": "strided"}, "cpu")
    with pytest.raises(TypeError, match=r"tensors\[0\]"):
        record_dispatch_path("probe", 3, "cpu")
    with pytest.raises(TypeError, match="autocast"):
        record_dispatch_path("probe", "cpu", "cpu", autocast=1)
