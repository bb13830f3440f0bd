"""Probe operators that report which dispatch keys really ran: the ground truth for ``predict_dispatch``.

No solution code lives here. We cannot watch the C++ dispatcher pick kernels for ``aten::add``, but we
can define our own operators and register a Python kernel at each key with ``torch.library.Library.impl(
..., with_keyset=True)``. Each kernel appends ``keyset.highestPriorityTypeId()`` - the key the real
dispatcher chose - to a log and then does what PyTorch's own kernel at that key does:

- backend keys (CPU, Meta): compute;
- ``Autograd`` (alias -> AutogradCPU, AutogradCUDA, AutogradMeta, ...): like ``VariableType``, redispatch
  ``keyset & after_autograd_keyset`` under ``_AutoDispatchBelowADInplaceOrView``;
- ``AutocastCPU``/``AutocastCUDA``: like ``autocast_mode.h``, call the op again with its key excluded;
- ``ADInplaceOrView`` (in-place probe only): bump the version counter, redispatch below itself;
- ``BackendSelect`` (factory probe only): like ``RegisterBackendSelect.cpp``, redispatch to the backend
  of ``device=``.

Python-key steps are logged by ``PathLoggingMode``, ``LoggedFakeTensorMode``, ``ProbeWrapper`` and, while a
recording runs, by FakeTensor's own ``__torch_dispatch__`` (the subclass step of a FakeTensor used outside
its mode).
PythonTLSSnapshot runs as a C++ fallback we must not replace, so the recorded path omits it.
"""
from __future__ import annotations

import contextlib
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

NAMESPACE = "ptinternals_probe"
_LOG: list[str] = []
_KEYSETS: list[str | None] = []  # the key set each logged kernel was called with (None for Python steps)
_LIB = None  # the torch.library.Library holding the probes (kept alive for the process)


def _log(entry: str, keyset=None) -> None:
    # Look the log up at call time: after importlib.reload the kernels registered first still write
    # into the current module's list.
    module = sys.modules[__name__]
    module._LOG.append(entry)
    module._KEYSETS.append(None if keyset is None else str(keyset))


def _key_name(keyset) -> str:
    return str(keyset.highestPriorityTypeId()).split(".")[-1]


def _log_key(keyset) -> str:
    key = _key_name(keyset)
    _log(key, keyset)
    return key


def _probe_ops():
    """Define (once per process) ``probe``, ``probe_`` and ``probe_factory`` in ``ptinternals_probe``."""
    global _LIB
    ns = getattr(torch.ops, NAMESPACE)
    if _LIB is not None or hasattr(ns, "probe"):
        return ns.probe.default, ns.probe_.default, ns.probe_factory.default
    lib = torch.library.Library(NAMESPACE, "FRAGMENT")
    lib.define("probe(Tensor self, Tensor other) -> Tensor")
    lib.define("probe_(Tensor(a!) self, Tensor other) -> Tensor(a!)")
    lib.define("probe_factory(SymInt[] size, *, Device? device=None) -> Tensor")
    probe, probe_, factory = ns.probe.default, ns.probe_.default, ns.probe_factory.default
    C = torch._C

    def backend(ks, a, b):
        _log_key(ks)
        return torch.empty_like(a) if a.device.type == "meta" else a + b

    def backend_inplace(ks, a, b):
        _log_key(ks)
        return a if a.device.type == "meta" else a.add_(b)

    def autograd(op):
        def kernel(ks, *args):
            _log_key(ks)
            with C._AutoDispatchBelowADInplaceOrView():
                return op.redispatch(ks & C._after_autograd_keyset, *args)
        return kernel

    def autocast(op):
        def kernel(ks, *args):
            key = _log_key(ks)
            with C._ExcludeDispatchKeyGuard(C.DispatchKeySet(getattr(C.DispatchKey, key))):
                return op(*args)
        return kernel

    def ad_inplace_or_view(ks, a, b):
        _log_key(ks)
        torch.autograd.graph.increment_version(a)
        with C._AutoDispatchBelowADInplaceOrView():
            return probe_.redispatch(ks & C._after_ADInplaceOrView_keyset, a, b)

    def backend_select(ks, size, device=None):
        _log_key(ks)
        dev = torch.device(device) if device is not None else torch.device("cpu")
        key = {"cpu": "CPU", "meta": "Meta", "cuda": "CUDA"}[dev.type]
        target = C.DispatchKeySet(getattr(C.DispatchKey, key))
        return factory.redispatch(target, size, device=device)

    def factory_backend(ks, size, device=None):
        _log_key(ks)
        return torch.zeros(size, device=device if device is not None else "cpu")

    for key in ("CPU", "Meta"):
        lib.impl("probe", backend, key, with_keyset=True)
        lib.impl("probe_", backend_inplace, key, with_keyset=True)
        lib.impl("probe_factory", factory_backend, key, with_keyset=True)
    lib.impl("probe", autograd(probe), "Autograd", with_keyset=True)
    lib.impl("probe_", autograd(probe_), "Autograd", with_keyset=True)
    lib.impl("probe_", ad_inplace_or_view, "ADInplaceOrView", with_keyset=True)
    lib.impl("probe_factory", backend_select, "BackendSelect", with_keyset=True)
    for key in ("AutocastCPU", "AutocastCUDA"):
        lib.impl("probe", autocast(probe), key, with_keyset=True)
    _LIB = lib
    return probe, probe_, factory


def probe_op(name: str = "probe"):
    """The OpOverload of probe ``name``: "probe" (out-of-place), "probe_" (in-place), "probe_factory"."""
    ops = dict(zip(("probe", "probe_", "probe_factory"), _probe_ops(), strict=True))
    if name not in ops:
        raise ValueError(f"name must be one of {sorted(ops)}, got {name!r}")
    return ops[name]


class PathLoggingMode(TorchDispatchMode):
    """A plain TorchDispatchMode that logs "Python" for probe ops and calls ``func(*args)``."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == NAMESPACE:
            _log("Python")
        return func(*args, **(kwargs or {}))


def _logged_fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    class LoggedFakeTensorMode(FakeTensorMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == NAMESPACE:
                _log("Python")
            return super().__torch_dispatch__(func, types, args, kwargs)

    return LoggedFakeTensorMode()


@contextlib.contextmanager
def _logged_fake_tensor_dispatch():
    """Log FakeTensor's own ``__torch_dispatch__`` (the subclass step of a FakeTensor used OUTSIDE its
    FakeTensorMode: it enters the mode and calls the op again) for the duration of one recording."""
    from torch._subclasses.fake_tensor import FakeTensor

    original = FakeTensor.__dict__["__torch_dispatch__"]

    def logged(cls, func, types, args=(), kwargs=None):
        if getattr(func, "namespace", None) == NAMESPACE:
            _log("Python")
        return original.__func__(cls, func, types, args, kwargs if kwargs is not None else {})

    FakeTensor.__torch_dispatch__ = classmethod(logged)
    try:
        yield
    finally:
        FakeTensor.__torch_dispatch__ = original


class ProbeWrapper(torch.Tensor):
    """A minimal wrapper subclass: logs "Python" for probe ops, unwraps and calls ``func`` on the inside."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device,
                                                   requires_grad=inner.requires_grad)

    def __init__(self, inner: torch.Tensor):
        self.inner = inner

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func.namespace == NAMESPACE:
            _log("Python")
        unwrap = lambda x: x.inner if isinstance(x, ProbeWrapper) else x  # noqa: E731
        return func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})


class _Desc:
    """The fields of a tensor description (as ``predict_dispatch`` takes them) that the probes build."""

    FIELDS = {"device": "cpu", "requires_grad": False, "inference": False, "subclass": None,
              "functional": False, "functionality": "Dense"}

    def __init__(self, **fields):
        unknown = set(fields) - set(self.FIELDS)
        if unknown:
            raise ValueError(f"unknown tensor description fields {sorted(unknown)}")
        self.__dict__.update({**self.FIELDS, **fields})

    @classmethod
    def coerce(cls, x, name: str) -> "_Desc":
        if isinstance(x, str):
            return cls(device=x)
        if isinstance(x, dict):
            return cls(**x)
        if hasattr(x, "__dataclass_fields__"):  # a dispatcher.TensorDesc
            return cls(**{k: getattr(x, k) for k in cls.FIELDS})
        raise TypeError(f"{name} must be a device string, a dict or a TensorDesc, got {type(x).__name__}")


def _make_tensor(desc, fake_mode) -> torch.Tensor:
    if desc.subclass == "fake":
        with fake_mode:
            t = torch.ones(3, device=desc.device)
        return t.requires_grad_(desc.requires_grad)
    if desc.device not in ("cpu", "meta") and not (desc.device == "cuda" and torch.cuda.is_available()):
        raise ValueError(f"cannot make a real tensor on device {desc.device!r} here (use subclass='fake')")
    if desc.functionality != "Dense":
        raise ValueError("the probes take dense tensors only")
    with torch.inference_mode(desc.inference):
        t = torch.ones(3, device=desc.device)
    if desc.requires_grad:
        t.requires_grad_(True)
    if desc.functional:
        t = torch._to_functional_tensor(t)
    if desc.subclass == "wrapper":
        t = ProbeWrapper(t)
    return t


def record_dispatch_path(name: str, *tensors, modes=(), grad_mode: bool = True, inference_mode: bool = False,
                         autocast=None, factory_device: str | None = None) -> list[str]:
    """Run probe op ``name`` on real tensors built from the descriptions (same arguments as
    ``predict_dispatch``) and return the keys whose kernels ran, PythonTLSSnapshot left out."""
    return [key for key, _ in record_dispatch_steps(name, *tensors, modes=modes, grad_mode=grad_mode,
                                                    inference_mode=inference_mode, autocast=autocast,
                                                    factory_device=factory_device)]


def record_dispatch_steps(name: str, *tensors, modes=(), grad_mode: bool = True, inference_mode: bool = False,
                          autocast=None, factory_device: str | None = None) -> list[tuple[str, str | None]]:
    """Like ``record_dispatch_path``, with the key set the real dispatcher handed each probe kernel
    (``str(DispatchKeySet)``; None for the Python steps, which the modes/subclass log)."""
    op = probe_op(name)
    descs = [_Desc.coerce(t, f"tensors[{i}]") for i, t in enumerate(tensors)]
    if isinstance(modes, int) and not isinstance(modes, bool):
        modes = ("python",) * modes
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    if any(m not in ("python", "fake") for m in modes):
        raise ValueError(f"modes entries must be 'python' or 'fake', got {modes!r}")
    fake_mode = _logged_fake_mode() if ("fake" in modes or any(d.subclass == "fake" for d in descs)) else None
    args = [_make_tensor(d, fake_mode) for d in descs]
    if autocast is not None and not isinstance(autocast, (str, tuple, list)):
        raise TypeError(f"autocast must be None, a device type or a tuple of them, got {autocast!r}")
    devices = (autocast,) if isinstance(autocast, str) else tuple(autocast or ())
    _LOG.clear()
    _KEYSETS.clear()
    with contextlib.ExitStack() as stack:
        if fake_mode is not None:
            stack.enter_context(_logged_fake_tensor_dispatch())
        stack.enter_context(torch.set_grad_enabled(grad_mode))
        if inference_mode:
            stack.enter_context(torch.inference_mode())
        for device in devices:
            stack.enter_context(torch.autocast(device, dtype=torch.bfloat16))
        for m in modes:
            stack.enter_context(fake_mode if m == "fake" else PathLoggingMode())
        if name == "probe_factory":
            op([2], device=factory_device)
        else:
            op(*args)
    return list(zip(_LOG, _KEYSETS, strict=True))
