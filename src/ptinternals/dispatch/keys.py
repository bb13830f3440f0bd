"""Dispatch keys and the 64-bit DispatchKeySet, as c10 packs them.

Mirrors (the functionality keys are read from the installed torch at import; the two versions the
course runs on are written out below, see ``FUNCTIONALITY_KEYS_BY_VERSION``):

- ``c10/core/DispatchKey.h``: ``enum class BackendComponent`` (CPUBit..MetaBit) and
  ``enum class DispatchKey`` (the *functionality* keys, lowest priority first), and the per-backend
  runtime keys built from both (``AutogradCPU`` = functionality ``AutogradFunctionality`` x backend
  ``CPUBit``).
- ``c10/core/DispatchKeySet.h``: the bit layout (16 backend bits below 46 functionality bits),
  ``highestPriorityTypeId``, set arithmetic (``operator-`` never removes backend bits), the named
  constants (``autograd_dispatch_keyset``, ``after_autograd_keyset``, ``default_included_set``, ...)
  and the iterator that prints a set as ``DispatchKeySet(CPU, ADInplaceOrView, AutogradCPU, ...)``.
- ``c10/core/TensorImpl.cpp`` (constructor): which keys a fresh tensor carries.
- ``c10/core/impl/LocalDispatchKeySet.h`` and the RAII guards of ``InferenceMode``, autocast and
  ``TorchDispatchModeTLS``: the thread-local include/exclude sets.

The priority of a key is simply its bit index: the dispatcher takes the *highest* set bit
("count leading zeros"). Every name here is the C++ name, so ``str()`` of a set matches
``str(torch._C._dispatch_keys(t))`` character for character.

Bit numbers are NOT stable across releases: torch 2.13 moved ``Fake`` below ``Python`` and deleted
``Named``, so from ``Python`` up every functionality key has another bit (and enum value) on torch 2.11
than on 2.13. The order of the keys the course follows is the same in both; the numbers are not.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

# --- c10/core/DispatchKey.h: BackendComponent (bit i-1 of the set holds backend i) -----------------
BACKENDS_2_13: tuple[str, ...] = (
    "CPU", "CUDA", "HIP", "XLA", "MPS", "IPU", "XPU", "HPU", "VE", "Lazy",
    "MTIA", "MAIA", "PrivateUse1", "PrivateUse2", "PrivateUse3", "Meta",
)

# --- c10/core/DispatchKey.h: functionality keys, enum value = priority (0 = Undefined, lowest) ----
# As torch 2.13 (CI, laptops) declares them:
FUNCTIONALITY_KEYS_2_13: tuple[str, ...] = (
    "Undefined",
    "Dense", "FPGA", "Vulkan", "Metal", "Quantized", "CustomRNGKeyId", "MkldnnCPU",
    "Sparse", "SparseCsr", "NestedTensor",
    "BackendSelect",            # factory functions: pick the backend from device=/dtype= arguments
    "Fake",                     # C++ FakeTensor mode; BELOW Python so that Python modes fire first
    "Python",                   # __torch_dispatch__: TorchDispatchMode or tensor subclass
    "FuncTorchDynamicLayerBackMode",
    "Functionalize",            # mutation/alias removal (torch.compile, export)
    "Conjugate", "Negative", "ZeroTensor",
    "ADInplaceOrView",          # version counters and view metadata for in-place and view ops
    "AutogradOther", "AutogradFunctionality", "AutogradNestedTensor",
    "Tracer",
    "AutocastCPU", "AutocastMTIA", "AutocastMAIA", "AutocastXPU", "AutocastIPU", "AutocastHPU",
    "AutocastXLA", "AutocastMPS", "AutocastCUDA", "AutocastPrivateUse1",
    "FuncTorchBatched", "BatchedNestedTensor", "FuncTorchVmapMode", "Batched", "VmapMode",
    "FuncTorchGradWrapper", "DeferredInit",
    "PythonTLSSnapshot",        # snapshots the TLS on entry so __torch_dispatch__ can restore it
    "FuncTorchDynamicLayerFrontMode",
    "TESTING_ONLY_GenericWrapper", "TESTING_ONLY_GenericMode",
    "PreDispatch",              # pre-dispatch tracing (torch.export)
    "PythonDispatcher",         # the Python re-implementation of the dispatcher
)
# torch 2.11 (the GPU machine) differs in two places: ``Fake`` was torchdistx's out-of-core key and sat
# just ABOVE Python, and ``Named`` (named tensors' error messages) followed Functionalize. 48 keys, not
# 47: Python is functionality 12 on 2.11 and 13 on 2.13, Conjugate 17 and 16, AutogradFunctionality 22
# and 21, and every per-backend runtime key's enum value is one higher on 2.11 (CPU: 50 vs 49).
_i = FUNCTIONALITY_KEYS_2_13.index
FUNCTIONALITY_KEYS_2_11: tuple[str, ...] = (
    FUNCTIONALITY_KEYS_2_13[:_i("Fake")] + ("Python", "Fake")
    + FUNCTIONALITY_KEYS_2_13[_i("Python") + 1:_i("Functionalize") + 1] + ("Named",)
    + FUNCTIONALITY_KEYS_2_13[_i("Functionalize") + 1:])
del _i
FUNCTIONALITY_KEYS_BY_VERSION = {"2.13": FUNCTIONALITY_KEYS_2_13, "2.11": FUNCTIONALITY_KEYS_2_11}


def read_layout_from_torch() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(backends, functionality keys) of the installed torch, lowest bit / priority first.

    ``torch._C.DispatchKey`` exposes only some keys (``Fake``, ``Named``, ``Tracer``... are missing), so
    the names are read off c10's own printing instead: a set holding one functionality bit prints that
    key's name (``toString(DispatchKey)``); a per-backend functionality (Dense, Autograd...) prints
    nothing without a backend bit, and ``highestPriorityTypeId`` names it by its ``StartOf<F>Backends``
    marker. The full set has one bit per backend and per functionality (Undefined has none)."""
    import torch

    C = torch._C
    num_backends = C._dispatch_num_backends()
    dense_bit = 1 << num_backends  # functionality 1 (Dense) sits just above the backend bits
    backends = tuple(str(C.DispatchKeySet.from_raw_repr(dense_bit | 1 << b))[len("DispatchKeySet("):-1]
                     for b in range(num_backends))
    num_functionality_bits = C._dispatch_keyset_full().raw_repr().bit_length() - num_backends
    keys = ["Undefined"]
    for f in range(1, num_functionality_bits + 1):
        ks = C.DispatchKeySet.from_raw_repr(1 << (num_backends + f - 1))
        name = str(ks)[len("DispatchKeySet("):-1]
        if not name:  # "DispatchKey.StartOfAutogradFunctionalityBackends" -> "AutogradFunctionality"
            name = str(ks.highestPriorityTypeId()).rsplit(".", 1)[-1][len("StartOf"):-len("Backends")]
        keys.append(name)
    return backends, tuple(keys)


BACKENDS, FUNCTIONALITY_KEYS = read_layout_from_torch()
_NEEDED = {"Dense", "Quantized", "Sparse", "SparseCsr", "NestedTensor", "AutogradFunctionality", "AutogradOther",
           "AutogradNestedTensor", "ADInplaceOrView", "BackendSelect", "Python", "PythonTLSSnapshot",
           "Functionalize", "PythonDispatcher", "Conjugate", "Negative"}
if _NEEDED - set(FUNCTIONALITY_KEYS) or set(BACKENDS_2_13) - set(BACKENDS):
    raise ImportError(f"this torch's c10 lacks dispatch keys the model needs: "
                      f"{sorted(_NEEDED - set(FUNCTIONALITY_KEYS)) + sorted(set(BACKENDS_2_13) - set(BACKENDS))}")
NUM_BACKENDS = len(BACKENDS)  # 16 -> bits 0..15
FULL_BACKEND_MASK = (1 << NUM_BACKENDS) - 1
FUNCTIONALITY_INDEX = {name: i for i, name in enumerate(FUNCTIONALITY_KEYS)}
NUM_FUNCTIONALITY_KEYS = len(FUNCTIONALITY_KEYS)  # = EndOfFunctionalityKeys: 47 on torch 2.13, 48 on 2.11

# Functionalities that have one runtime key per backend, with the prefix of that key's name.
PER_BACKEND_FUNCTIONALITIES: dict[str, str] = {
    "Dense": "", "Quantized": "Quantized", "Sparse": "Sparse", "SparseCsr": "SparseCsr",
    "NestedTensor": "NestedTensor", "AutogradFunctionality": "Autograd",
}

# Runtime key name -> (functionality index, backend index 1..16 or 0 for "no backend").
RUNTIME_KEYS: dict[str, tuple[int, int]] = {}
for _f in FUNCTIONALITY_KEYS:
    RUNTIME_KEYS[_f] = (FUNCTIONALITY_INDEX[_f], 0)
for _f, _prefix in PER_BACKEND_FUNCTIONALITIES.items():
    for _b, _backend in enumerate(BACKENDS, start=1):
        RUNTIME_KEYS[_prefix + _backend] = (FUNCTIONALITY_INDEX[_f], _b)

# "StartOfAutogradFunctionalityBackends" etc.: what highestPriorityTypeId returns for a per-backend
# functionality with no backend bit (toRuntimePerBackendFunctionalityKey(f, InvalidBit)).
_BLOCK_OF_START_MARKER = {
    f"StartOf{f}Backends": i for i, f in enumerate(PER_BACKEND_FUNCTIONALITIES)}

# torch.device.type -> BackendComponent (c10/core/DeviceType.h + Backend.h)
DEVICE_TO_BACKEND = {
    "cpu": "CPU", "cuda": "CUDA", "hip": "HIP", "xla": "XLA", "mps": "MPS", "ipu": "IPU", "xpu": "XPU",
    "hpu": "HPU", "ve": "VE", "lazy": "Lazy", "mtia": "MTIA", "maia": "MAIA", "privateuseone": "PrivateUse1",
    "meta": "Meta",
}
# c10/core/DispatchKeySet.h getAutocastRelatedKeySetFromBackend: which backends have an autocast key
AUTOCAST_KEY_OF_BACKEND = {
    "CPU": "AutocastCPU", "MTIA": "AutocastMTIA", "MAIA": "AutocastMAIA", "XPU": "AutocastXPU",
    "IPU": "AutocastIPU", "HPU": "AutocastHPU", "CUDA": "AutocastCUDA", "XLA": "AutocastXLA",
    "PrivateUse1": "AutocastPrivateUse1", "MPS": "AutocastMPS",
}
# getAutogradRelatedKeySetFromBackend: these backends have their own Autograd<Backend> key; the
# others (HIP, VE, PrivateUse2/3) fall back to AutogradOther.
BACKENDS_WITH_AUTOGRAD_KEY = ("CPU", "IPU", "MTIA", "MAIA", "XPU", "CUDA", "XLA", "Lazy", "Meta", "MPS",
                              "HPU", "PrivateUse1", "PrivateUse2", "PrivateUse3")


def dispatch_key_value(key: str) -> int:
    """The ``DispatchKey`` enum value of a runtime key (``int(torch._C.DispatchKey.CPU)``).

    Functionality keys number 0..46 on torch 2.13 (0..47 on 2.11); after ``EndOfFunctionalityKeys``
    (47; 48) each per-backend functionality gets a block ``StartOf<F>Backends, <F>CPU, ..., <F>Meta`` of
    17 values, in the order Dense, Quantized, Sparse, SparseCsr, NestedTensor, AutogradFunctionality."""
    if key.startswith("StartOf") and key.endswith("Backends"):  # see highest_priority_key
        block, b = _BLOCK_OF_START_MARKER.get(key, -1), 0
        if block < 0:
            raise ValueError(f"key {key!r} is not a dispatch key")
    else:
        f, b = RUNTIME_KEYS[_check_key(key)]
        if b == 0:
            return f
        block = list(PER_BACKEND_FUNCTIONALITIES).index(FUNCTIONALITY_KEYS[f])
    return NUM_FUNCTIONALITY_KEYS + 1 + block * (NUM_BACKENDS + 1) + b


def _bit_of_functionality(index: int) -> int:
    return 1 << (NUM_BACKENDS + index - 1)  # functionality k lives at bit 16 + k - 1


def _bit_of_backend(index: int) -> int:
    return 1 << (index - 1)  # backend b (1-based) lives at bit b - 1


def _check_key(key: str, what: str = "key") -> str:
    if not isinstance(key, str):
        raise TypeError(f"{what} must be a dispatch key name (str), got {type(key).__name__}")
    if key not in RUNTIME_KEYS:
        raise ValueError(f"{what} {key!r} is not a runtime dispatch key "
                         f"(e.g. 'CPU', 'AutogradCUDA', 'Python')")
    return key


class DispatchKeySet:
    """A set of dispatch keys packed into 64 bits exactly as ``c10::DispatchKeySet`` packs them.

    Bits 0..15 are *backend* bits (CPUBit..MetaBit), bits 16..61 are *functionality* bits. A runtime
    key such as ``AutogradCPU`` is the pair (functionality bit ``AutogradFunctionality``, backend bit
    ``CPU``), so a set holding {CPU, AutogradCUDA} also "has" CPU-and-CUDA of both: the dispatcher
    only ever asks for the highest functionality and the highest backend.
    """

    __slots__ = ("_repr",)

    def __init__(self, keys: Iterable[str] = (), *, raw: int | None = None):
        if raw is not None:
            if not isinstance(raw, int) or raw < 0 or raw >= 1 << 64:
                raise ValueError(f"raw must be an unsigned 64-bit int, got {raw!r}")
            self._repr = raw
            return
        if isinstance(keys, str):
            keys = [keys]
        value = 0
        for k in keys:
            f, b = RUNTIME_KEYS[_check_key(k, "keys[...]")]
            if f != 0:
                value |= _bit_of_functionality(f)
            if b != 0:
                value |= _bit_of_backend(b)
        self._repr = value

    # -- constructors of the C++ named sets ----------------------------------------------------------
    @classmethod
    def full(cls) -> "DispatchKeySet":
        """``DispatchKeySet(FULL)``: every backend and functionality bit."""
        return cls(raw=(1 << (NUM_BACKENDS + NUM_FUNCTIONALITY_KEYS - 1)) - 1)

    @classmethod
    def full_after(cls, key: str) -> "DispatchKeySet":
        """``DispatchKeySet(FULL_AFTER, key)``: every key of *lower* priority than ``key`` (all backend
        bits included), plus PythonDispatcher, which the C++ constructor always adds back."""
        f, _ = RUNTIME_KEYS[_check_key(key)]
        below = cls(raw=_bit_of_functionality(f) - 1)
        return below | cls(["PythonDispatcher"])

    @classmethod
    def backend_mask(cls) -> "DispatchKeySet":
        return cls(raw=FULL_BACKEND_MASK)

    # -- set algebra (DispatchKeySet.h operators) -----------------------------------------------------
    def raw_repr(self) -> int:
        return self._repr

    def __or__(self, other: "DispatchKeySet") -> "DispatchKeySet":
        return DispatchKeySet(raw=self._repr | _as_set(other)._repr)

    def __and__(self, other: "DispatchKeySet") -> "DispatchKeySet":
        return DispatchKeySet(raw=self._repr & _as_set(other)._repr)

    def __sub__(self, other: "DispatchKeySet") -> "DispatchKeySet":
        # Note [Removing keys from DispatchKeySet Only Affects Functionality Keys]:
        # ``repr_ & (full_backend_mask | ~other.repr_)`` - backend bits always survive.
        return DispatchKeySet(raw=self._repr & (FULL_BACKEND_MASK | ~_as_set(other)._repr) & ((1 << 64) - 1))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DispatchKeySet) and other._repr == self._repr

    def __hash__(self) -> int:
        return hash(self._repr)

    def add(self, key: str) -> "DispatchKeySet":
        return self | DispatchKeySet([key])

    def remove(self, key: str) -> "DispatchKeySet":
        """Remove a key's *functionality* bit only (``DispatchKeySet::remove``)."""
        bits = DispatchKeySet([key])._repr & ~FULL_BACKEND_MASK
        return DispatchKeySet(raw=self._repr & ~bits)

    def remove_backend(self, backend: str) -> "DispatchKeySet":
        """Clear one *backend* bit (``DispatchKeySet::remove_backend``)."""
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        return DispatchKeySet(raw=self._repr & ~_bit_of_backend(BACKENDS.index(backend) + 1))

    def has(self, key: str) -> bool:
        """``has_all(DispatchKeySet(key))``: both the functionality and the backend bit are set."""
        if _check_key(key) == "Undefined":
            raise ValueError("key 'Undefined' has no bit; has('Undefined') is meaningless")
        want = DispatchKeySet([key])._repr
        return self._repr & want == want

    def empty(self) -> bool:
        return self._repr == 0

    # -- priority -------------------------------------------------------------------------------------
    def highest_functionality_key(self) -> str:
        idx = self._repr.bit_length()  # indexOfHighestBit: 64 - countLeadingZeros
        if idx <= NUM_BACKENDS:
            return "Undefined"
        return FUNCTIONALITY_KEYS[idx - NUM_BACKENDS]

    def highest_backend(self) -> str | None:
        idx = (self._repr & FULL_BACKEND_MASK).bit_length()
        return BACKENDS[idx - 1] if idx else None

    def highest_priority_key(self) -> str:
        """``highestPriorityTypeId``: the highest functionality; if it is a per-backend functionality
        (Dense, Autograd, Sparse...) combine it with the highest backend bit (Dense+CUDA -> "CUDA")."""
        f = self.highest_functionality_key()
        if f in PER_BACKEND_FUNCTIONALITIES:
            backend = self.highest_backend()
            if backend is None:  # no backend bit: C++ returns the block's StartOf marker, not a real key
                return f"StartOf{f}Backends"
            return PER_BACKEND_FUNCTIONALITIES[f] + backend
        return f

    # -- iteration and printing (DispatchKeySet::iterator, toString) ---------------------------------
    def __iter__(self) -> Iterator[str]:
        """Runtime keys, lowest priority first; per-backend functionalities expand over backend bits."""
        for f in range(1, NUM_FUNCTIONALITY_KEYS):
            if not self._repr & _bit_of_functionality(f):
                continue
            name = FUNCTIONALITY_KEYS[f]
            if name in PER_BACKEND_FUNCTIONALITIES:
                for b in range(1, NUM_BACKENDS + 1):
                    if self._repr & _bit_of_backend(b):
                        yield PER_BACKEND_FUNCTIONALITIES[name] + BACKENDS[b - 1]
            else:
                yield name

    def keys(self) -> list[str]:
        return list(self)

    def __repr__(self) -> str:
        return "DispatchKeySet(" + ", ".join(self) + ")"

    __str__ = __repr__

    @classmethod
    def parse(cls, text: str) -> "DispatchKeySet":
        """Read ``str(torch._C._dispatch_keys(t))``: ``"DispatchKeySet(CPU, AutogradCPU)"``.

        Names this torch build has and the model lacks raise ValueError (a new key to add here)."""
        if not isinstance(text, str):
            text = str(text)  # a torch.DispatchKeySet
        text = text.strip()
        if not (text.startswith("DispatchKeySet(") and text.endswith(")")):
            raise ValueError(f"text must look like 'DispatchKeySet(CPU, ...)', got {text[:60]!r}")
        body = text[len("DispatchKeySet("):-1].strip()
        names = [n.strip() for n in body.split(",") if n.strip()]
        return cls(names)


def _as_set(x) -> DispatchKeySet:
    if not isinstance(x, DispatchKeySet):
        raise TypeError(f"expected a DispatchKeySet, got {type(x).__name__}")
    return x


# --- c10/core/DispatchKeySet.h named sets --------------------------------------------------------------
AUTOGRAD_DISPATCH_KEYSET = DispatchKeySet(["AutogradOther", "AutogradNestedTensor"]) | DispatchKeySet(
    raw=_bit_of_functionality(FUNCTIONALITY_INDEX["AutogradFunctionality"]))  # no backend bits on purpose
AUTOCAST_DISPATCH_KEYSET = DispatchKeySet(sorted(set(AUTOCAST_KEY_OF_BACKEND.values())))
AUTOGRAD_WITH_AD_INPLACE_OR_VIEW = AUTOGRAD_DISPATCH_KEYSET | DispatchKeySet(["ADInplaceOrView"])
PYTHON_KS = DispatchKeySet(["Python", "PythonTLSSnapshot"])
DEFAULT_INCLUDED_SET = DispatchKeySet(["BackendSelect", "ADInplaceOrView"])
DEFAULT_EXCLUDED_SET = AUTOCAST_DISPATCH_KEYSET
AFTER_AUTOGRAD_KEYSET = DispatchKeySet.full_after("AutogradOther")  # the lowest autograd key
AFTER_AD_INPLACE_OR_VIEW_KEYSET = DispatchKeySet.full_after("ADInplaceOrView")
AFTER_FUNC_KEYSET = DispatchKeySet.full_after("Functionalize").remove("ADInplaceOrView")
# aten/src/ATen/core/PythonFallbackKernel.cpp: "All the keys below the Python key" - the exclude set
# that pythonFallback installs, i.e. every key *above* Python (PythonDispatcher excepted).
AFTER_PYTHON_KEYSET = DispatchKeySet(raw=DispatchKeySet.full().raw_repr() ^ (
    DispatchKeySet.full_after("Python") | DispatchKeySet(["Python"])).raw_repr())


def backend_of_device(device: str) -> str:
    """``"cuda:1"`` -> ``"CUDA"`` (the BackendComponent of a device type)."""
    if not isinstance(device, str):
        device = str(device)  # torch.device
    kind = device.split(":", 1)[0].strip().lower()
    if kind not in DEVICE_TO_BACKEND:
        raise ValueError(f"device {device!r} has no dispatch backend; known: {sorted(DEVICE_TO_BACKEND)}")
    return DEVICE_TO_BACKEND[kind]


def tensor_key_set(device: str = "cpu", *, functionality: str = "Dense", inference: bool = False,
                   python: bool = False, functional: bool = False, conj: bool = False,
                   neg: bool = False) -> DispatchKeySet:
    """The key set a new tensor carries (``TensorImpl`` constructor and friends).

    - the backend key: ``functionality`` x device (Dense+CPU = "CPU", Sparse+CUDA = "SparseCUDA");
    - unless it is an inference tensor: ADInplaceOrView and Autograd<Backend> - even when
      ``requires_grad=False`` ("TODO: Ideally we only add AutogradBackend key when the tensor requires
      grad", TensorImpl.cpp), which is why requires_grad is not a parameter here;
    - Autocast<Backend> when the backend has one (Meta has none);
    - Python + PythonTLSSnapshot for subclasses with ``__torch_dispatch__`` (FakeTensor included);
    - Functionalize for FunctionalTensorWrapper, Conjugate/Negative for lazy conj/neg views.
    """
    backend = backend_of_device(device)
    if functionality not in ("Dense", "Quantized", "Sparse", "SparseCsr", "NestedTensor"):
        raise ValueError(f"functionality must be one of Dense, Quantized, Sparse, SparseCsr, NestedTensor; "
                         f"got {functionality!r}")
    ks = DispatchKeySet([PER_BACKEND_FUNCTIONALITIES[functionality] + backend])
    if functionality == "NestedTensor":
        ks = ks.add("AutogradNestedTensor")
    if inference:
        ks = ks - AUTOGRAD_WITH_AD_INPLACE_OR_VIEW
    else:
        autograd_key = "Autograd" + backend if backend in BACKENDS_WITH_AUTOGRAD_KEY else "AutogradOther"
        ks = ks | DispatchKeySet(["ADInplaceOrView", autograd_key])
    if backend in AUTOCAST_KEY_OF_BACKEND:
        ks = ks.add(AUTOCAST_KEY_OF_BACKEND[backend])
    if python:
        ks = ks | PYTHON_KS
    if functional:
        ks = ks.add("Functionalize")
    if conj:
        ks = ks.add("Conjugate")
    if neg:
        ks = ks.add("Negative")
    return ks


def tensor_keys(device: str = "cpu", *, requires_grad: bool = False, inference: bool = False,
                subclass: str | None = None, functional: bool = False, conj: bool = False,
                sparse: bool = False) -> list[str]:
    """The names of the runtime keys of a tensor made this way, sorted: ``tensor_key_set`` with the
    description of the chapter's first exercise (``subclass``: None, "wrapper" or "fake"; ``sparse``: a
    sparse COO layout). ``requires_grad`` changes nothing, as in ``TensorImpl``."""
    if subclass not in (None, "wrapper", "fake"):
        raise ValueError(f"subclass must be None, 'wrapper' or 'fake', got {subclass!r}")
    ks = tensor_key_set(device, functionality="Sparse" if sparse else "Dense", inference=inference,
                        python=subclass is not None, functional=functional, conj=conj)
    return sorted(ks)


@dataclass(frozen=True)
class LocalDispatchKeySet:
    """``c10::impl::LocalDispatchKeySet``: the thread-local keys added to (included) and removed
    from (excluded) every dispatch on this thread."""

    included: DispatchKeySet
    excluded: DispatchKeySet

    def apply(self, ks: DispatchKeySet) -> DispatchKeySet:
        """``(ks | included_) - excluded_`` as in ``DispatchKeyExtractor::computeDispatchKeySet``."""
        return (ks | self.included) - self.excluded

    def include(self, ks: DispatchKeySet) -> "LocalDispatchKeySet":
        return LocalDispatchKeySet(self.included | ks, self.excluded)

    def exclude(self, ks: DispatchKeySet) -> "LocalDispatchKeySet":
        return LocalDispatchKeySet(self.included, self.excluded | ks)

    def uninclude(self, ks: DispatchKeySet) -> "LocalDispatchKeySet":
        return LocalDispatchKeySet(self.included - ks, self.excluded)


def _autocast_devices(autocast) -> tuple[str, ...]:
    if autocast is None or autocast is False:
        return ()
    if isinstance(autocast, str):
        autocast = (autocast,)
    if not isinstance(autocast, (tuple, list, set, frozenset)):
        raise TypeError(f"autocast must be None, a device type like 'cpu' or a tuple of them, "
                        f"got {autocast!r}")
    out = []
    for d in autocast:
        backend = backend_of_device(d)
        if backend not in AUTOCAST_KEY_OF_BACKEND:
            raise ValueError(f"autocast device {d!r} has no autocast dispatch key")
        out.append(backend)
    return tuple(out)


def tls_key_sets(*, grad_mode: bool = True, inference_mode: bool = False, autocast=None,
                 python_modes: int = 0, meta_in_tls: bool = False) -> LocalDispatchKeySet:
    """The thread-local include/exclude sets that PyTorch's context managers leave behind.

    - default (``c10/core/DispatchKeySet.h``): include {BackendSelect, ADInplaceOrView}, exclude every
      Autocast key (autocast is *off* by excluding its keys);
    - ``torch.autocast(device)``: removes that device's Autocast key from the exclude set;
    - ``torch.inference_mode()``: stops including ADInplaceOrView and excludes the autograd keys;
    - ``torch.no_grad()``: changes nothing here - GradMode is a separate thread-local flag that the
      Autograd kernel reads, so the Autograd kernel still runs (it just records no graph);
    - a pushed TorchDispatchMode: includes Python and PythonTLSSnapshot;
    - FakeTensor's kernel invocation (``_set_meta_in_tls_dispatch_include``): includes Meta.
    """
    if not isinstance(grad_mode, bool) or not isinstance(inference_mode, bool):
        raise TypeError("grad_mode and inference_mode must be bools")
    if not isinstance(python_modes, int) or isinstance(python_modes, bool) or python_modes < 0:
        raise ValueError(f"python_modes must be an int >= 0, got {python_modes!r}")
    included, excluded = DEFAULT_INCLUDED_SET, DEFAULT_EXCLUDED_SET
    for backend in _autocast_devices(autocast):
        excluded = excluded.remove(AUTOCAST_KEY_OF_BACKEND[backend])
    if inference_mode:
        included = included.remove("ADInplaceOrView")
        excluded = excluded | AUTOGRAD_DISPATCH_KEYSET
    if python_modes:
        included = included | PYTHON_KS
    if meta_in_tls:
        included = included.add("Meta")
    return LocalDispatchKeySet(included, excluded)
