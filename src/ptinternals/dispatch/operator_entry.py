"""An operator's dispatch table: from registrations (incl. alias keys) to one kernel per runtime key.

Mirrors ``aten/src/ATen/core/dispatch/OperatorEntry.cpp`` ``computeDispatchTableEntryWithDebug`` (the
Python twin is ``torch/_ops.py`` ``resolve_key``) and ``c10/core/DispatchKeySet.cpp``
``getRuntimeDispatchKeySet`` / ``getBackendKeySetFromAutograd``. For each runtime key the table takes,
in order:

1. a kernel registered directly at that key ("kernel");
2. a kernel registered at an *alias* key that covers it:
   CompositeExplicitAutogradNonFunctional, then CompositeExplicitAutograd ("default backend kernel",
   backend keys only), CompositeImplicitAutograd ("math kernel", backend *and* autograd keys - but an
   autograd key only when its backend has no kernel of its own), Autograd ("autograd kernel");
3. the global backend fallback of that key ("backend fallback"), which may be a fallthrough;
4. nothing: calling the op with that key raises "Could not run ... with arguments from the ... backend".

``registrations_from_torch`` / ``dispatch_table_from_torch`` read the real thing from
``torch._C._dispatch_dump`` / ``_dispatch_dump_table`` so the model can be checked op by op.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .keys import (
    AUTOGRAD_DISPATCH_KEYSET,
    BACKENDS,
    FULL_BACKEND_MASK,
    RUNTIME_KEYS,
    DispatchKeySet,
)

ALIAS_KEYS = (
    "Autograd", "CompositeImplicitAutograd", "FuncTorchBatchedDecomposition",
    "CompositeImplicitAutogradNestedTensor", "CompositeExplicitAutograd",
    "CompositeExplicitAutogradNonFunctional",
)

_ALL_BACKENDS = DispatchKeySet(raw=FULL_BACKEND_MASK)
# backends without an Autograd<Backend> key of their own use AutogradOther
AUTOGRADOTHER_BACKENDS = _ALL_BACKENDS | DispatchKeySet(
    ["FPGA", "Vulkan", "Metal", "CustomRNGKeyId", "MkldnnCPU", "Sparse", "SparseCsr", "Quantized"])
BACKEND_DISPATCH_KEYSET = AUTOGRADOTHER_BACKENDS | DispatchKeySet(["Dense"])
# LazyTensor and XLA run the functionalization pass in eager mode: no non-functional decompositions
NON_FUNCTIONAL_BACKEND_DISPATCH_KEYSET = (BACKEND_DISPATCH_KEYSET.remove("Sparse")
                                          .remove_backend("XLA").remove_backend("Lazy"))
MATH_DISPATCH_KEYSET = BACKEND_DISPATCH_KEYSET | AUTOGRAD_DISPATCH_KEYSET | DispatchKeySet(["NestedTensor"])
NESTED_DISPATCH_KEYSET = DispatchKeySet(["AutogradNestedTensor", "NestedTensor"]) | _ALL_BACKENDS

# The global backend fallbacks (TORCH_LIBRARY_IMPL(_, Key, m) { m.fallback(...) }) of the keys this
# chapter follows, as torch 2.11-2.13 register them. True = fallthrough (skip the key entirely).
BACKEND_FALLBACKS: dict[str, bool] = {
    "PythonDispatcher": False,   # PythonFallbackKernel.cpp pythonDispatcherFallback
    "PreDispatch": False,        # PythonFallbackKernel.cpp preDispatchFallback: a no-op redispatch
    "PythonTLSSnapshot": False,  # PythonFallbackKernel.cpp pythonTLSSnapshotFallback
    "AutocastCPU": True, "AutocastCUDA": True, "AutocastXPU": True, "AutocastMPS": True,  # autocast_mode.cpp
    # VariableFallbackKernel.cpp: "autograd not implemented" (redispatches; warns if backward reaches it)
    "AutogradOther": False, "AutogradCPU": False, "AutogradCUDA": False, "AutogradXLA": False,
    "AutogradMPS": False, "AutogradXPU": False, "AutogradHPU": False, "AutogradLazy": False,
    "AutogradMTIA": False, "AutogradPrivateUse1": False, "AutogradMeta": False,
    "ADInplaceOrView": True,     # VariableFallbackKernel.cpp: only in-place and view ops need it
    "ZeroTensor": False, "Negative": False, "Conjugate": False,  # materialise the lazy bit, redispatch
    "Functionalize": False,      # FunctionalizeFallbackKernel.cpp
    "Python": False,             # PythonFallbackKernel.cpp pythonFallback -> __torch_dispatch__
    "BackendSelect": True,       # BackendSelectFallbackKernel.cpp: only factory functions need it
    "Meta": False,               # MetaFallbackKernel.cpp: raises "no fake impl or Meta kernel registered"
}

# The runtime keys whose table entries this chapter models and checks against torch.
MODELLED_KEYS = (
    "PythonDispatcher", "PreDispatch", "PythonTLSSnapshot", "AutocastCUDA", "AutocastCPU",
    "AutogradNestedTensor", "AutogradMeta", "AutogradCUDA", "AutogradCPU", "AutogradOther",
    "ADInplaceOrView", "ZeroTensor", "Negative", "Conjugate", "Functionalize", "Python", "BackendSelect",
    "Meta", "CUDA", "CPU", "Undefined",
)


@dataclass(frozen=True)
class Kernel:
    """One dispatch table entry: where it came from (``kind``, the C++ debug string) and whether it is a
    fallthrough (the dispatcher masks such keys out before it even looks)."""

    kind: str  # "kernel" | "default backend kernel" | "math kernel" | "nested kernel" | "autograd kernel"
    #            | "batched kernel" | "backend fallback" | "ambiguous autogradother"
    fallthrough: bool = False


def runtime_keys_of_alias(alias: str) -> DispatchKeySet:
    """``getRuntimeDispatchKeySet``: the runtime keys an alias key stands for."""
    table = {
        "Autograd": AUTOGRAD_DISPATCH_KEYSET | _ALL_BACKENDS,
        "CompositeImplicitAutograd": MATH_DISPATCH_KEYSET,
        "CompositeImplicitAutogradNestedTensor": NESTED_DISPATCH_KEYSET,
        "CompositeExplicitAutograd": BACKEND_DISPATCH_KEYSET,
        "CompositeExplicitAutogradNonFunctional": NON_FUNCTIONAL_BACKEND_DISPATCH_KEYSET,
        "FuncTorchBatchedDecomposition": DispatchKeySet(["FuncTorchBatched", "BatchedNestedTensor"]),
    }
    if alias not in table:
        raise ValueError(f"alias must be one of {sorted(table)}, got {alias!r}")
    return table[alias]


def is_included_in_alias(key: str, alias: str) -> bool:
    return key != "Undefined" and runtime_keys_of_alias(alias).has(key)


def backend_keys_of_autograd_key(key: str) -> DispatchKeySet:
    """``getBackendKeySetFromAutograd``: AutogradCPU -> {CPU}; AutogradOther -> the 'other' backends."""
    if key == "AutogradOther":
        return AUTOGRADOTHER_BACKENDS
    if key == "AutogradNestedTensor":
        return DispatchKeySet(["NestedTensor"]) | _ALL_BACKENDS
    if key.startswith("Autograd") and key[len("Autograd"):] in BACKENDS:
        return DispatchKeySet([key[len("Autograd"):]])
    return DispatchKeySet()


def _check_registrations(registrations) -> dict[str, bool]:
    if not isinstance(registrations, dict):
        raise TypeError(f"registrations must be a dict {{key: is_fallthrough}}, "
                        f"got {type(registrations).__name__}")
    out = {}
    for key, fallthrough in registrations.items():
        if key not in RUNTIME_KEYS and key not in ALIAS_KEYS:
            raise ValueError(f"registrations: {key!r} is neither a runtime nor an alias dispatch key")
        if key == "Undefined":
            raise ValueError("registrations: cannot register a kernel at 'Undefined'")
        if not isinstance(fallthrough, bool):
            raise TypeError(f"registrations[{key!r}] must be a bool (is it a fallthrough?), "
                            f"got {fallthrough!r}")
        out[key] = fallthrough
    return out


def compute_table_entry(registrations: dict[str, bool], key: str,
                        fallbacks: dict[str, bool] = BACKEND_FALLBACKS) -> Kernel | None:
    """The kernel the dispatcher stores for runtime ``key`` (``None`` = missing)."""
    regs = registrations

    def has_any(ks: DispatchKeySet) -> bool:  # hasKernelForAnyDispatchKey: direct, non-alias registrations
        return any(k not in ALIAS_KEYS and k != "Undefined" and ks.has(k) for k in regs)

    # 1. a direct registration
    if key in regs:
        return Kernel("kernel", regs[key])
    undefined = key == "Undefined"
    # 2.1 / 2.2 CompositeExplicitAutograd(NonFunctional): backend keys only
    for alias in ("CompositeExplicitAutogradNonFunctional", "CompositeExplicitAutograd"):
        if alias in regs and (undefined or is_included_in_alias(key, alias)):
            return Kernel("default backend kernel", regs[alias])
    has_backend_kernel = has_any(backend_keys_of_autograd_key(key)) or "CompositeExplicitAutograd" in regs
    # 2.3 CompositeImplicitAutograd(NestedTensor): a decomposition, used only where no real kernel exists
    if (not undefined and is_included_in_alias(key, "CompositeImplicitAutogradNestedTensor")
            and "CompositeImplicitAutogradNestedTensor" in regs and not has_backend_kernel):
        return Kernel("nested kernel", regs["CompositeImplicitAutogradNestedTensor"])
    implicit = "CompositeImplicitAutograd"
    if implicit in regs and (undefined or is_included_in_alias(key, implicit)):
        if key == "AutogradOther" and has_any(AUTOGRADOTHER_BACKENDS):
            return Kernel("ambiguous autogradother")
        if not has_backend_kernel:
            return Kernel("math kernel", regs["CompositeImplicitAutograd"])
    # 2.4 the Autograd alias
    if "Autograd" in regs and is_included_in_alias(key, "Autograd"):
        return Kernel("autograd kernel", regs["Autograd"])
    if "FuncTorchBatchedDecomposition" in regs and is_included_in_alias(key, "FuncTorchBatchedDecomposition"):
        return Kernel("batched kernel", regs["FuncTorchBatchedDecomposition"])
    # 3. the backend fallback
    if key in fallbacks:
        return Kernel("backend fallback", fallbacks[key])
    return None  # 4. missing


def compute_dispatch_table(registrations: dict[str, bool], keys=MODELLED_KEYS,
                           fallbacks: dict[str, bool] = BACKEND_FALLBACKS) -> dict[str, Kernel]:
    """``{runtime key: Kernel}`` for ``keys``; keys without any kernel are absent."""
    regs = _check_registrations(registrations)
    table = {}
    for key in keys:
        if key not in RUNTIME_KEYS:
            raise ValueError(f"keys: {key!r} is not a runtime dispatch key")
        entry = compute_table_entry(regs, key, fallbacks)
        if entry is not None:
            table[key] = entry
    return table


def non_fallthrough_keys(table: dict[str, Kernel], backend: str | None = None) -> DispatchKeySet:
    """``OperatorEntry``'s ``nonFallthroughKeys_`` (per backend): the full set minus fallthrough keys.

    A fallthrough at a per-backend key (AutogradCPU) only counts for that key's backend - the C++ keeps
    one mask per backend (``nonFallthroughKeysPerBackend_``) and picks it by the highest backend bit."""
    mask = DispatchKeySet.full()
    for key, kernel in table.items():
        if key == "Undefined" or not kernel.fallthrough:
            continue
        _, b = RUNTIME_KEYS[key]
        if b == 0 or backend is None or BACKENDS[b - 1] == backend:
            mask = mask.remove(key)
    return mask


# --- reading the real tables --------------------------------------------------------------------------
_REG_LINE = re.compile(r"^(?P<key>\w+)(?P<alias>\[alias\])?(?P<inactive> \(inactive\))?: registered at .*?"
                       r"(?:::.*\[(?P<flags>[^\]]*)\])?\s*$")
_TABLE_LINE = re.compile(r"^(?P<key>\w+): (?P<ft>fallthrough )?registered at .* \[(?P<kind>[^\]]+)\]\s*$")


def _qualified(op) -> str:
    if not isinstance(op, str):
        name = getattr(op, "_schema", None)
        if name is None:
            raise TypeError(f"op must be a name like 'aten::add.Tensor' or an OpOverload, "
                            f"got {type(op).__name__}")
        op = f"{name.name}.{name.overload_name}" if name.overload_name else name.name
    if "::" not in op:
        raise ValueError(f"op must be qualified with its namespace, like 'aten::add.Tensor', got {op!r}")
    return op


def _dump(fn, op) -> str:
    name = _qualified(op)
    text = fn(name)
    if not text:
        raise ValueError(f"op {name!r} is not registered with the dispatcher "
                         f"(overload name missing or wrong?)")
    return text


def registrations_from_torch(op) -> dict[str, bool]:
    """The kernels registered for ``op`` (runtime and alias keys -> is_fallthrough), read from
    ``torch._C._dispatch_dump``. Keys this model does not know (e.g. functorch's) are skipped."""
    import torch

    out = {}
    for line in _dump(torch._C._dispatch_dump, op).splitlines():
        m = _REG_LINE.match(line.strip())
        if not m or m.group("inactive"):
            continue
        key = m.group("key")
        if key in RUNTIME_KEYS or key in ALIAS_KEYS:
            out[key] = "fallthrough" in (m.group("flags") or "")
    return out


def dispatch_table_from_torch(op, keys=MODELLED_KEYS) -> dict[str, Kernel]:
    """The dispatch table torch computed for ``op``, read from ``torch._C._dispatch_dump_table``."""
    import torch

    wanted = set(keys)
    table = {}
    for line in _dump(torch._C._dispatch_dump_table, op).splitlines():
        m = _TABLE_LINE.match(line.strip())
        if m and m.group("key") in wanted:
            table[m.group("key")] = Kernel(m.group("kind"), bool(m.group("ft")))
    return table
