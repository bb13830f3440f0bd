"""keys.py against c10: bit layout, priorities, named sets, tensor key sets and thread-local sets."""
import contextlib
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from ptinternals.dispatch.keys import (
    AFTER_AD_INPLACE_OR_VIEW_KEYSET,
    AFTER_AUTOGRAD_KEYSET,
    BACKENDS,
    BACKENDS_2_13,
    FUNCTIONALITY_KEYS,
    FUNCTIONALITY_KEYS_BY_VERSION,
    RUNTIME_KEYS,
    DispatchKeySet,
    backend_of_device,
    dispatch_key_value,
    tensor_key_set,
    tls_key_sets,
)

C = torch._C
DK = C.DispatchKey
# The model reads the key layout from the installed torch (keys.read_layout_from_torch), so every exact
# bit and enum-value comparison below runs on torch 2.13 (CI) and 2.11 (make compat) alike.
TORCH = ".".join(torch.__version__.split(".")[:2])


def torch_names(ks) -> list[str]:
    return [n.strip() for n in str(ks)[len("DispatchKeySet("):-1].split(",") if n.strip()]


class Wrapper(torch.Tensor):
    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device,
                                                   requires_grad=inner.requires_grad)

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError


class NullMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


EXPOSED = [k for k in DK.__members__ if k in RUNTIME_KEYS and k != "Undefined"]


@pytest.mark.skipif(TORCH not in FUNCTIONALITY_KEYS_BY_VERSION, reason=f"no written-out layout for torch {TORCH}")
def test_layout_read_from_torch_is_the_one_the_text_describes():
    # The written-out tables (and the chapter's numbers) are the ones of the versions the course runs on.
    assert FUNCTIONALITY_KEYS == FUNCTIONALITY_KEYS_BY_VERSION[TORCH]
    assert BACKENDS == BACKENDS_2_13
    assert len(FUNCTIONALITY_KEYS) == {"2.13": 47, "2.11": 48}[TORCH]
    assert int(DK.Python) == FUNCTIONALITY_KEYS.index("Python") == {"2.13": 13, "2.11": 12}[TORCH]


def test_the_two_versions_differ_only_in_fake_and_named():
    new, old = FUNCTIONALITY_KEYS_BY_VERSION["2.13"], FUNCTIONALITY_KEYS_BY_VERSION["2.11"]
    assert [k for k in old if k != "Named"] == [k for k in new if k != "Fake"][:12] + ["Python", "Fake"] + [
        k for k in new if k != "Fake"][13:]
    assert old.index("Fake") > old.index("Python") and new.index("Fake") < new.index("Python")
    assert "Named" not in new and old.index("Named") == old.index("Functionalize") + 1
    followed = ("BackendSelect", "Python", "Functionalize", "Conjugate", "ADInplaceOrView", "AutogradFunctionality",
                "AutocastCPU", "AutocastCUDA", "PythonTLSSnapshot", "PreDispatch", "PythonDispatcher")
    assert sorted(followed, key=old.index) == sorted(followed, key=new.index)  # the course's order holds on both


@pytest.mark.parametrize("key", EXPOSED)
def test_single_key_bits_match_c10(key):
    assert DispatchKeySet([key]).raw_repr() == C.DispatchKeySet(getattr(DK, key)).raw_repr()


def test_enum_values_and_priority_order_match_torch():
    for key in EXPOSED:
        assert dispatch_key_value(key) == int(getattr(DK, key)), key
    functionality = [k for k in EXPOSED if RUNTIME_KEYS[k][1] == 0]
    by_torch = sorted(functionality, key=lambda k: int(getattr(DK, k)))
    by_model = sorted(functionality, key=lambda k: RUNTIME_KEYS[k][0])
    assert by_torch == by_model  # the priority order, version-robust
    assert C._dispatch_num_backends() == len(BACKENDS)


def test_named_sets_match_torch():
    assert list(AFTER_AUTOGRAD_KEYSET) == torch_names(C._after_autograd_keyset)
    assert list(AFTER_AD_INPLACE_OR_VIEW_KEYSET) == torch_names(C._after_ADInplaceOrView_keyset)
    full_after_python = C._dispatch_keyset_full_after(DK.Python)
    assert list(DispatchKeySet.full_after("Python")) == torch_names(full_after_python)
    assert DispatchKeySet.full().raw_repr() == C._dispatch_keyset_full().raw_repr()
    assert DispatchKeySet.full_after("Python").raw_repr() == full_after_python.raw_repr()


@given(st.integers(0, 2**62 - 1), st.integers(0, 2**62 - 1), st.booleans())
def test_random_sets_print_and_pick_like_c10(a, b, no_backend):
    raw = a & b
    if no_backend:
        raw &= ~0xFFFF
    ours, theirs = DispatchKeySet(raw=raw), C.DispatchKeySet.from_raw_repr(raw)
    assert str(ours) == str(theirs)
    assert dispatch_key_value(ours.highest_priority_key()) == int(theirs.highestPriorityTypeId())


def test_set_algebra_keeps_backend_bits_on_subtraction():
    ks = DispatchKeySet(["CPU", "AutogradCPU", "AutocastCPU"])
    assert (ks - DispatchKeySet(["AutogradCUDA"])).keys() == ["CPU", "AutocastCPU"]  # CPU bit survives
    assert ks.remove("AutogradCPU").keys() == ["CPU", "AutocastCPU"]
    assert ks.has("AutogradCPU") and not ks.has("AutogradCUDA")
    assert ks.highest_priority_key() == "AutocastCPU"
    assert (ks | DispatchKeySet(["CUDA"])).has("AutogradCUDA")  # bits, not keys: CUDA bit + Autograd bit
    assert DispatchKeySet.parse(str(ks)) == ks
    assert ks.remove_backend("CPU").keys() == ["AutocastCPU"]


def _make(device, inference, requires_grad, kind, fake_mode):
    if kind == "fake":
        with fake_mode:
            return torch.empty(3, device=device, requires_grad=requires_grad)
    with torch.inference_mode(inference):  # a wrapper is an inference tensor if *it* is made in the mode
        t = torch.zeros(3, device=device, requires_grad=requires_grad)
        if kind == "wrapper":
            return Wrapper(t)
    if kind == "functional":
        return torch._to_functional_tensor(t)
    if kind == "neg":
        return torch.zeros(3, dtype=torch.cfloat, device=device)._neg_view()
    if kind == "conj":
        return torch.zeros(3, dtype=torch.cfloat, device=device).conj()
    return t


@given(device=st.sampled_from(["cpu", "meta"]), inference=st.booleans(), requires_grad=st.booleans(),
       kind=st.sampled_from(["plain", "wrapper", "functional", "fake", "neg", "conj"]))
def test_tensor_key_sets_match_dispatch_keys(device, inference, requires_grad, kind):
    from torch._subclasses.fake_tensor import FakeTensorMode

    if kind == "fake":
        inference = False
    if kind in ("neg", "conj", "functional"):
        requires_grad = inference = False
    fake_mode = FakeTensorMode()
    t = _make(device, inference, requires_grad, kind, fake_mode)
    ours = tensor_key_set(device, inference=inference, python=kind in ("wrapper", "fake"),
                          functional=kind == "functional", neg=kind == "neg", conj=kind == "conj")
    assert list(ours) == torch_names(C._dispatch_keys(t))
    assert t.requires_grad == requires_grad  # requires_grad set, key set unchanged


def test_fake_cuda_tensor_key_set_on_any_build():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        t = torch.empty(2, device="cuda")
    assert list(tensor_key_set("cuda", python=True)) == torch_names(C._dispatch_keys(t))


@pytest.mark.parametrize("make,functionality", [
    (lambda: torch.zeros(2, 2).to_sparse(), "Sparse"),
    (lambda: torch.zeros(2, 2).to_sparse_csr(), "SparseCsr"),
    (lambda: torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)]), "NestedTensor"),
])
def test_other_functionalities(make, functionality):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = make()
    assert list(tensor_key_set("cpu", functionality=functionality)) == torch_names(C._dispatch_keys(t))


@given(grad=st.booleans(), inference=st.booleans(), autocast=st.booleans(), modes=st.integers(0, 2))
def test_tls_sets_match_torch(grad, inference, autocast, modes):
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.set_grad_enabled(grad))
        if inference:
            stack.enter_context(torch.inference_mode())
        if autocast:
            stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
        for _ in range(modes):
            stack.enter_context(NullMode())
        inc, exc = C._dispatch_tls_local_include_set(), C._dispatch_tls_local_exclude_set()
    ours = tls_key_sets(grad_mode=grad, inference_mode=inference, autocast="cpu" if autocast else None,
                        python_modes=modes)
    assert list(ours.included) == torch_names(inc)
    assert list(ours.excluded) == torch_names(exc)


def test_meta_in_tls_include():
    with torch._C._PreserveDispatchKeyGuard():
        torch._C._set_meta_in_tls_dispatch_include(True)
        inc = C._dispatch_tls_local_include_set()
    assert list(tls_key_sets(meta_in_tls=True).included) == torch_names(inc)


def test_invalid_inputs():
    with pytest.raises(ValueError, match="not a runtime dispatch key"):
        DispatchKeySet(["Autograd"])  # an alias key has no bit
    with pytest.raises(TypeError, match="dispatch key name"):
        DispatchKeySet([3])
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        DispatchKeySet(raw=-1)
    with pytest.raises(ValueError, match="DispatchKeySet"):
        DispatchKeySet.parse("CPU, CUDA")
    with pytest.raises(ValueError, match="no dispatch backend"):
        backend_of_device("tpu")
    with pytest.raises(ValueError, match="functionality"):
        tensor_key_set("cpu", functionality="Strided")
    with pytest.raises(ValueError, match="python_modes"):
        tls_key_sets(python_modes=-1)
    with pytest.raises(TypeError, match="autocast"):
        tls_key_sets(autocast=3)
    with pytest.raises(ValueError, match="autocast dispatch key"):
        tls_key_sets(autocast="meta")
    with pytest.raises(TypeError, match="DispatchKeySet"):
        DispatchKeySet(["CPU"]) | 3
    with pytest.raises(ValueError, match="meaningless"):
        DispatchKeySet().has("Undefined")
    with pytest.raises(ValueError, match="backend"):
        DispatchKeySet().remove_backend("TPU")
