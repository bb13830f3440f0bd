"""operator_entry.py against OperatorEntry.cpp: the computed dispatch table of real and custom ops."""
import pytest
import torch

from ptinternals.dispatch.keys import RUNTIME_KEYS
from ptinternals.dispatch.operator_entry import (
    ALIAS_KEYS,
    BACKEND_FALLBACKS,
    MODELLED_KEYS,
    Kernel,
    compute_dispatch_table,
    dispatch_table_from_torch,
    is_included_in_alias,
    non_fallthrough_keys,
    registrations_from_torch,
)

C = torch._C
DK = C.DispatchKey

ATEN_OPS = [
    "aten::add.Tensor", "aten::add_.Tensor", "aten::mm", "aten::matmul", "aten::linear",
    "aten::empty.memory_format", "aten::zeros", "aten::view", "aten::t", "aten::transpose.int",
    "aten::_to_copy", "aten::clone", "aten::copy_", "aten::sum", "aten::relu", "aten::detach", "aten::conj",
    "aten::native_layer_norm", "aten::layer_norm",
    "aten::dropout", "aten::embedding", "aten::index.Tensor", "aten::cat", "aten::nonzero",
    "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::convolution", "aten::convolution_backward", "aten::_efficientzerotensor",
]


@pytest.mark.parametrize("op", ATEN_OPS)
def test_aten_tables_match_torch(op):
    ours = compute_dispatch_table(registrations_from_torch(op))
    theirs = dispatch_table_from_torch(op)
    assert {k: ours.get(k) for k in MODELLED_KEYS} == {k: theirs.get(k) for k in MODELLED_KEYS}


def test_alias_membership_matches_torch():
    keys = [k for k in DK.__members__ if k in RUNTIME_KEYS and k != "Undefined"]
    for alias in ALIAS_KEYS:
        for k in keys:
            assert is_included_in_alias(k, alias) == C._dispatch_is_included_in_alias(
                getattr(DK, k), getattr(DK, alias)), (k, alias)


def test_backend_fallbacks_match_torch():
    for key in BACKEND_FALLBACKS:
        assert C._dispatch_has_backend_fallback(getattr(DK, key)), key
    # a bare op shows which fallbacks are fallthroughs
    lib = torch.library.Library("ptinternals_test_bare", "FRAGMENT")
    try:
        lib.define("bare(Tensor self) -> Tensor")
        table = dispatch_table_from_torch("ptinternals_test_bare::bare", keys=RUNTIME_KEYS)
        for key, fallthrough in BACKEND_FALLBACKS.items():
            assert table[key] == Kernel("backend fallback", fallthrough), key
        assert compute_dispatch_table({}) == {k: v for k, v in table.items() if k in MODELLED_KEYS}
    finally:
        lib._destroy()


REGISTRATION_CASES = {
    # where kernels are registered -> the table must follow OperatorEntry's precedence rules
    "implicit_only": ["CompositeImplicitAutograd"],
    "explicit_and_autograd": ["CompositeExplicitAutograd", "Autograd"],
    "cpu_and_implicit": ["CPU", "CompositeImplicitAutograd"],  # math kernel must not fill AutogradCPU
    "nonfunctional_and_cpu": ["CompositeExplicitAutogradNonFunctional", "CPU"],
    "autogradcpu_only": ["AutogradCPU", "Meta"],
    "explicit_and_implicit": ["CompositeExplicitAutograd", "CompositeImplicitAutograd"],
}


@pytest.mark.parametrize("case", sorted(REGISTRATION_CASES))
def test_custom_registrations_match_torch(case):
    ns = f"ptinternals_test_{case}"
    lib = torch.library.Library(ns, "FRAGMENT")
    try:
        lib.define("op(Tensor self) -> Tensor")
        for key in REGISTRATION_CASES[case]:
            lib.impl("op", lambda x: x.clone(), key)
        regs = registrations_from_torch(f"{ns}::op")
        assert set(regs) == set(REGISTRATION_CASES[case])
        ours = compute_dispatch_table(regs)
        theirs = dispatch_table_from_torch(f"{ns}::op")
        assert {k: ours.get(k) for k in MODELLED_KEYS} == {k: theirs.get(k) for k in MODELLED_KEYS}
    finally:
        lib._destroy()


def test_fallthrough_registration_and_mask():
    regs = registrations_from_torch("aten::mm")
    assert regs["Conjugate"] is True  # mm registers a fallthrough at Conjugate: conj is folded into the GEMM
    table = compute_dispatch_table(regs)
    mask = non_fallthrough_keys(table, "CPU")
    for key in ("Conjugate", "ADInplaceOrView", "BackendSelect"):
        assert not mask.has(key)
    for key in ("AutocastCPU", "AutogradCPU", "CPU", "Python"):  # mm has a real autocast kernel
        assert mask.has(key)


def test_per_backend_fallthrough_only_masks_its_backend():
    table = {"AutogradCPU": Kernel("kernel", True), "AutogradCUDA": Kernel("kernel", False)}
    assert not non_fallthrough_keys(table, "CPU").has("AutogradCPU")
    assert non_fallthrough_keys(table, "CUDA").has("AutogradCUDA")


def test_invalid_inputs():
    with pytest.raises(TypeError, match="registrations must be a dict"):
        compute_dispatch_table([("CPU", False)])
    with pytest.raises(ValueError, match="neither a runtime nor an alias"):
        compute_dispatch_table({"GPU": False})
    with pytest.raises(TypeError, match="must be a bool"):
        compute_dispatch_table({"CPU": "kernel"})
    with pytest.raises(ValueError, match="Undefined"):
        compute_dispatch_table({"Undefined": False})
    with pytest.raises(ValueError, match="keys"):
        compute_dispatch_table({}, keys=["Autograd"])
    with pytest.raises(ValueError, match="qualified"):
        registrations_from_torch("add.Tensor")
    with pytest.raises(TypeError, match="op must be"):
        dispatch_table_from_torch(3)
